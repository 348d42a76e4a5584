"""requirements/lock.txt and pyproject.toml agree, and every install path reads the lock.

A dependency added to pyproject.toml without a refresh of the lock, a bound raised
past the locked version, or a package the project no longer needs left in the lock
fails here, before CI installs anything (``bash ops/lock/refresh.sh`` repairs it)."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent.parent
LOCK_TEXT = (ROOT / "requirements" / "lock.txt").read_text()


def load_lockfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lockfile", ROOT / "ops" / "lock" / "lockfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lockfile"] = module  # dataclasses look their module up while they build
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["lockfile"]
    return module


lockfile = load_lockfile()
LOCK = lockfile.parse(LOCK_TEXT)


def project_requirements() -> list[Requirement]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize("requirement", project_requirements(), ids=str)
def test_every_requirement_of_pyproject_is_locked_at_a_version_it_allows(
        requirement: Requirement) -> None:
    name = lockfile.canonical(requirement.name)
    assert name in LOCK.versions, f"{requirement} is not in the lock: bash ops/lock/refresh.sh"
    version = LOCK.versions[name]
    assert requirement.specifier.contains(version, prereleases=True), (
        f"the lock has {name}=={version}, which {requirement} excludes: "
        "bash ops/lock/refresh.sh --upgrade-package " + name)


def test_the_lock_names_as_direct_only_what_pyproject_requires() -> None:
    required = {lockfile.canonical(r.name) for r in project_requirements()}
    direct = {n for n, parents in LOCK.needed_by.items() if lockfile.PROJECT_ROOT in parents}
    assert direct == required, (
        f"stale in the lock: {sorted(direct - required)}; "
        f"missing: {sorted(required - direct)}: bash ops/lock/refresh.sh")


def test_every_locked_package_is_needed_by_the_project() -> None:
    required = {lockfile.canonical(r.name) for r in project_requirements()}
    orphans = set(LOCK.versions) - LOCK.closure(required)
    assert not orphans, f"locked but needed by nothing: {sorted(orphans)}"


def test_every_locked_package_carries_its_hashes() -> None:
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK_TEXT.split("\n", 2)[2])
    unhashed = [b.split("==")[0] for b in blocks if "==" in b and "--hash=sha256:" not in b]
    assert not unhashed
    assert len(blocks) == len(LOCK.versions)


def test_the_parser_reads_one_and_several_parents() -> None:
    lock = lockfile.parse(
        "# header\nA_b==1.0 \\\n    --hash=sha256:00\n    # via carpool (pyproject.toml)\n"
        "c.D==2 \\\n    --hash=sha256:11\n    # via\n    #   a-b\n    #   e\n")
    assert lock.versions == {"a-b": "1.0", "c-d": "2"}
    assert lock.needed_by == {"a-b": frozenset({lockfile.PROJECT_ROOT}),
                              "c-d": frozenset({"a-b", "e"})}
    assert lock.closure({"A.B"}) == {"a-b", "c-d"}


@pytest.mark.parametrize("path, line", [
    (".ci/run", "--require-hashes -r requirements/lock.txt"),
    ("README.md", "pip install -c requirements/constraints.txt -e '.[worker,local]'"),
    ("ops/docker/web.Dockerfile", "--constraint requirements/constraints.txt"),
    ("ops/docker/worker.Dockerfile", "--constraint requirements/constraints.txt"),
    ("ops/docker/flower.Dockerfile", "--constraint requirements/constraints.txt"),
    ("ops/gpu/wheelhouse.sh", "ops/lock/lockfile.py"),
])
def test_every_install_path_reads_the_lock(path: str, line: str) -> None:
    assert line in (ROOT / path).read_text()


def test_the_gpu_wheelhouse_names_no_version_of_its_own() -> None:
    script = (ROOT / "ops" / "gpu" / "wheelhouse.sh").read_text()
    assert not re.search(r"[A-Za-z0-9]==\d", script), "versions come from the lock"


def test_the_dockerignore_lets_the_constraints_into_the_images() -> None:
    assert "!requirements/constraints.txt" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_constraints_are_the_lock_without_its_hashes() -> None:
    # pip reads a hash in a constraints file as hash-checking mode for everything,
    # which `pip install -c ... -e .` cannot satisfy: so a second, hashless view.
    constraints = (ROOT / "requirements" / "constraints.txt").read_text()
    assert constraints == lockfile.constraints_text(LOCK), "bash ops/lock/refresh.sh"
    assert "--hash" not in constraints
