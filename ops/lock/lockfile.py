"""Reads ``requirements/lock.txt``: the pinned version of every package, and who needs it.

The lock is uv's output in pip-tools' format (``name==version``, its ``--hash`` lines,
then ``# via`` lines naming the packages that require it). Its readers here: the unit
test that holds pyproject.toml and the lock together, and the GPU wheelhouse, which
takes its versions from the lock::

    python ops/lock/lockfile.py celery redis --without pytest
    # name==version for celery, redis and all they need, less what pytest needs
    python ops/lock/lockfile.py --constraints > requirements/constraints.txt

``requirements/constraints.txt`` is the lock without its hashes, for ``pip install -c``:
pip reads a hash in a constraints file as a demand that every requirement be hashed,
which an editable or local-folder install (``-e .``, ``.[s3]``) cannot be.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

#: The lock every install path uses (README, .ci/run, the images, the GPU wheelhouse).
LOCK_PATH = Path(__file__).resolve().parents[2] / "requirements" / "lock.txt"
#: The first lines of requirements/constraints.txt.
CONSTRAINTS_HEADER = ("# requirements/lock.txt without its hashes, for `pip install -c`.\n"
                      "# Made by `bash ops/lock/refresh.sh`; do not edit.\n")
#: What uv writes in a ``# via`` line for a requirement of the project itself.
PROJECT_ROOT = "carpool (pyproject.toml)"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_VIA_ONE = re.compile(r"^\s+# via (\S.*)$")
_VIA_MORE = re.compile(r"^\s+#\s{3}(\S.*)$")


def canonical(name: str) -> str:
    """The PEP 503 form of a distribution name: ``Flask_SQL.x`` → ``flask-sql-x``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Lock:
    """Every locked package: its version, and the packages (or the project) that need it."""

    versions: dict[str, str]
    needed_by: dict[str, frozenset[str]]

    def closure(self, roots: set[str]) -> set[str]:
        """``roots`` and every package they need, by the lock's own ``# via`` lines."""
        needs: dict[str, set[str]] = {}
        for child, parents in self.needed_by.items():
            for parent in parents:
                needs.setdefault(parent, set()).add(child)
        seen, todo = set(), [canonical(r) for r in roots]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(needs.get(name, ()))
        return seen


def parse(text: str) -> Lock:
    """The lock's pins and ``# via`` graph; parents are canonical names or ``PROJECT_ROOT``."""
    versions: dict[str, str] = {}
    needed_by: dict[str, set[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        pin, via = _PIN.match(line), _VIA_ONE.match(line) or _VIA_MORE.match(line)
        if pin:
            current = canonical(pin.group(1))
            versions[current] = pin.group(2)
            needed_by[current] = set()
        elif current and via:
            parent = via.group(1).strip()
            needed_by[current].add(parent if parent == PROJECT_ROOT else canonical(parent))
    return Lock(versions, {k: frozenset(v) for k, v in needed_by.items()})


def load(path: Path = LOCK_PATH) -> Lock:
    return parse(path.read_text())


def constraints_text(lock: Lock) -> str:
    """The lock's pins without hashes: the body of ``requirements/constraints.txt``."""
    pins = "".join(f"{name}=={version}\n" for name, version in sorted(lock.versions.items()))
    return CONSTRAINTS_HEADER + pins


def main(argv: list[str]) -> int:
    lock = load()
    if argv == ["--constraints"]:
        print(constraints_text(lock), end="")
        return 0
    roots, _, without = " ".join(argv).partition("--without")
    wanted, held = set(roots.split()), set(without.split())
    missing = sorted(n for n in wanted | held if canonical(n) not in lock.versions)
    if missing:
        print(f"not in {LOCK_PATH.name}: {', '.join(missing)}", file=sys.stderr)
        return 1
    # A package named among the roots stays, even when a held one needs it too.
    kept = (lock.closure(wanted) - lock.closure(held)) | {canonical(n) for n in wanted}
    for name in sorted(kept):
        print(f"{name}=={lock.versions[name]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
