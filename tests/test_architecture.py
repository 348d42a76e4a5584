"""The import arrows that the architecture promises (docs/architecture.md), read from
the source: the core never imports the worker, the bench never imports the
simulator, and the bench runs its --help without the bench extra."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports in functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def importers(folder: str, prefix: str) -> list[str]:
    """Files under ``folder`` that import ``prefix`` or a module below it."""
    return sorted(
        str(path.relative_to(ROOT)) for path in (ROOT / folder).rglob("*.py")
        if any(m == prefix or m.startswith(prefix + ".") for m in imported_modules(path)))


def test_no_module_of_the_core_imports_the_worker() -> None:
    assert importers("carpool", "worker") == []


def test_the_web_imports_neither_the_worker_nor_torch() -> None:
    assert importers("web", "worker") == [] and importers("web", "torch") == []


def test_the_bench_never_imports_the_simulator() -> None:
    # The simulator replays the bench's arrivals (carpool.bench.arrivals): one arrow only.
    assert importers("carpool/bench", "carpool.sim") == []


def test_the_scan_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f() -> None:\n    from worker.observe.calibrate import command\n")
    assert "worker.observe.calibrate" in imported_modules(module)


#: Runs the `carpool` command line in a process where the bench extra's packages
#: cannot be imported (None in sys.modules makes an import fail as if absent).
WITHOUT_BENCH_EXTRA = (
    "import sys\n"
    "for name in ('matplotlib', 'matplotlib.pyplot', 'tqdm'):\n"
    "    sys.modules[name] = None\n"
    "from carpool.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def without_bench_extra(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_BENCH_EXTRA, *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_carpool_bench_help_works_without_the_bench_extra() -> None:
    done = without_bench_extra("bench", "--help")
    assert done.returncode == 0, done.stderr
    assert "carpool bench run" in done.stdout


@pytest.mark.parametrize("argv", [("bench", "run", "--rate", "1"),
                                  ("bench", "simulate", "--duration", "1")],
                         ids=["run", "simulate"])
def test_a_bench_command_without_the_extra_says_how_to_install_it_before_any_work(
        argv: tuple[str, ...], tmp_path: Path) -> None:
    done = without_bench_extra(*argv, "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "pip install 'carpool[bench]'" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_the_worker_adds_calibrate_through_the_commands_entry_point() -> None:
    import tomllib
    from importlib.metadata import entry_points

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["entry-points"]["carpool.stack.commands"]
    assert declared == {"calibrate": "worker.shell.cli:register"}
    installed = {ep.name: ep.value for ep in entry_points(group="carpool.stack.commands")}
    assert installed == declared, (
        "the installed package metadata is older than pyproject.toml: pip install -e .")
