"""The import arrows that the architecture promises (docs/architecture.md), read from
the source: each layer imports only the layers below it, the web never imports torch,
and the bench runs its --help without the bench extra."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


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


#: The top folders whose imports are ruled: the torch-free core, and one per process kind.
PROCESS_KINDS = ("carpool", "web", "worker", "dispatcher", "feeder")
#: What any room of the web may import of the core.
CORE_FOR_WEB = {"carpool.core", "carpool.scheduling", "carpool.admission", "carpool.backend",
                "carpool.intake"}
#: The modules at web/'s top that assemble the web process; each other module there, and
#: each folder, is a room of its own with its own row.
WEB_ASSEMBLY = {"app", "gunicorn_conf"}

#: Each layer and the layers it may import (besides itself and the standard library).
#: Lower layers never import higher ones; docs/architecture.md draws the same map.
ALLOWED: dict[str, set[str]] = {
    "carpool.core": set(),
    "carpool.scheduling": {"carpool.core"},
    "carpool.admission": {"carpool.core", "carpool.scheduling"},
    "carpool.backend": {"carpool.core", "carpool.scheduling", "carpool.admission"},
    "carpool.client": {"carpool.core"},
    "carpool.stack": {"carpool.core", "carpool.scheduling", "carpool.backend"},
    "carpool.bench": {"carpool.core", "carpool.scheduling", "carpool.admission",
                      "carpool.backend", "carpool.stack", "carpool.client"},
    "carpool.sim": {"carpool.core", "carpool.scheduling", "carpool.admission",
                    "carpool.backend", "carpool.bench"},
    "carpool.cli": {"carpool.core", "carpool.backend", "carpool.stack", "carpool.client",
                    "carpool.bench", "carpool.sim"},
    "carpool.intake": {"carpool.core", "carpool.admission"},
    # The web, one row per room: results (the listener) < common < the surfaces < the
    # assembly at web/'s top (the app, gunicorn's config), which alone sees every surface.
    "web.results": CORE_FOR_WEB,
    "web.common": CORE_FOR_WEB | {"web.results"},
    "web.events": CORE_FOR_WEB | {"web.common", "web.results"},
    "web.jobs": CORE_FOR_WEB | {"web.common", "web.results"},
    "web.open_inference": CORE_FOR_WEB | {"web.common", "web.results"},
    "web.openai": CORE_FOR_WEB | {"web.common", "web.results"},
    "web.openapi": CORE_FOR_WEB | {"web.events"},
    "web.server_routes": CORE_FOR_WEB | {"web.common", "web.openapi"},
    "web.rollouts": CORE_FOR_WEB | {"web.common"},
    "web": CORE_FOR_WEB | {"web.common", "web.results", "web.events", "web.jobs",
                           "web.open_inference", "web.openai", "web.openapi",
                           "web.server_routes", "web.rollouts"},
    # The two torch-free process kinds beside web/ and worker/.
    "dispatcher": {"carpool.core", "carpool.backend"},
    "feeder": {"carpool.core", "carpool.admission", "carpool.backend", "carpool.intake"},
    "worker.device": {"carpool.core", "carpool.backend"},
    "worker.handlers": {"carpool.core", "worker.device"},
    "worker.executors": {"carpool.core", "worker.device", "worker.handlers"},
    "worker.loop": {"carpool.core", "carpool.scheduling", "carpool.backend", "worker.device",
                    "worker.handlers", "worker.executors"},
    "worker.observe": {"carpool.core", "carpool.scheduling", "carpool.backend",
                       "worker.device", "worker.handlers", "worker.executors", "worker.loop"},
    "worker.shell": {"carpool.core", "carpool.scheduling", "carpool.backend", "worker.device",
                     "worker.handlers", "worker.executors", "worker.loop", "worker.observe"},
    "worker.celery_app": {"carpool.core", "worker.shell"},
}
#: Third-party packages a layer may not import at all.
FORBIDDEN_PACKAGES: dict[str, set[str]] = {
    "carpool": {"torch", "celery", "flask"},  # the core installs without the worker's stack
    "web": {"torch", "celery"},  # a web replica starts in well under a second
    "feeder": {"torch", "celery", "flask"},  # it runs from the web image, without the web
    "dispatcher": {"torch", "celery", "flask"},
    "carpool.scheduling": {"redis"},  # the batch decision is pure
}


def layer_of(module: str) -> str | None:
    """The layer ``carpool.core.jobs``, ``worker.loop.loop`` or ``web.jobs.routes`` belongs
    to (None: not ours)."""
    parts = module.split(".")
    if parts[0] == "web":
        return "web" if len(parts) == 1 or parts[1] in WEB_ASSEMBLY else f"web.{parts[1]}"
    if parts[0] in PROCESS_KINDS and parts[0] not in ("carpool", "worker"):
        return parts[0]
    if parts[0] not in ("carpool", "worker") or len(parts) == 1:
        return None
    return f"{parts[0]}.{parts[1]}"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def wrong_arrows() -> list[str]:
    found = []
    for top in PROCESS_KINDS:
        for path in sorted((ROOT / top).rglob("*.py")):
            own = layer_of(module_name(path))
            if own is None:
                continue
            for imported in sorted(imported_modules(path)):
                other = layer_of(imported)
                if other is not None and other != own and other not in ALLOWED[own]:
                    found.append(f"{module_name(path)} imports {imported}")
                for scope, banned in FORBIDDEN_PACKAGES.items():
                    if (own == scope or own.startswith(scope + ".")) and \
                            imported.split(".")[0] in banned:
                        found.append(f"{module_name(path)} imports {imported}")
    return found


def test_every_module_belongs_to_a_layer_with_rules() -> None:
    for top in PROCESS_KINDS:
        for path in (ROOT / top).rglob("*.py"):
            own = layer_of(module_name(path))
            assert own is None or own in ALLOWED, f"{path}: layer {own} has no rule"
    assert sorted(p.name for p in (ROOT / "carpool").glob("*.py")) == ["__init__.py", "cli.py"]


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert wrong_arrows() == []


def test_the_rule_catches_a_wrong_arrow(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from carpool.backend.queue import Queue\n")
    assert layer_of("carpool.core.jobs") == "carpool.core"
    assert "carpool.backend" not in ALLOWED["carpool.core"]
    assert "carpool.backend.queue" in imported_modules(module)


def test_the_scan_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f() -> None:\n    from worker.observe.calibrate import command\n")
    assert "worker.observe.calibrate" in imported_modules(module)


#: Lines a module may have (tests and ops included); Lua's own check is test_script_args.
MAX_MODULE_LINES = 400
#: Modules and packages at web/'s top: the assembly and one folder per room.
MAX_WEB_TOP = 12


def our_modules() -> dict[str, Path]:
    return {module_name(path): path for top in PROCESS_KINDS
            for path in sorted((ROOT / top).rglob("*.py"))}


def import_circles(modules: dict[str, Path]) -> list[list[str]]:
    """The import circles among ``modules`` (lazy imports too): ``from a import b`` is
    an arrow to ``a.b`` when that is a module, else to ``a``."""
    arrows: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                arrows[name].update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                whole = node.module in modules and len(subs) < len(node.names)
                arrows[name].update(subs | ({node.module} if whole else set()))
        arrows[name].discard(name)
    circles, done = [], set[str]()
    for start in sorted(modules):  # each module's circle: the modules that reach it back
        if start in done:
            continue
        seen, todo = {start}, [start]
        while todo:
            for nxt in arrows[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        back = {m for m in seen if m != start and _reaches(arrows, m, start)}
        if back:
            circles.append(sorted({start, *back}))
            done |= back | {start}
    return circles


def _reaches(arrows: dict[str, set[str]], source: str, target: str) -> bool:
    seen, todo = {source}, [source]
    while todo:
        for nxt in arrows[todo.pop()] - seen:
            if nxt == target:
                return True
            seen.add(nxt)
            todo.append(nxt)
    return False


def test_no_import_circle_among_our_modules() -> None:
    assert import_circles(our_modules()) == []


def test_the_circle_check_sees_a_lazy_circle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from pkg import b\n")
    (tmp_path / "b.py").write_text("def f() -> None:\n    from pkg.a import x\n")
    mods = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    assert import_circles(mods) == [["pkg.a", "pkg.b"]]


def test_no_module_is_over_400_lines_and_web_has_at_most_12_at_its_top() -> None:
    paths = [p for top in (*PROCESS_KINDS, "ops", "tests") for p in (ROOT / top).rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in paths
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
    top = [p.name for p in (ROOT / "web").iterdir()
           if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())]
    assert len(top) <= MAX_WEB_TOP, sorted(top)


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
        "project"]["entry-points"]["carpool.commands"]
    assert declared == {"calibrate": "worker.shell.cli:register"}
    installed = {ep.name: ep.value for ep in entry_points(group="carpool.commands")}
    assert installed == declared, (
        "the installed package metadata is older than pyproject.toml: pip install -e .")
