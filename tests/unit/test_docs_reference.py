"""docs/reference.md against the code: its settings table names exactly the
environment variables that `carpool/core/settings.py` reads, and its metrics
table exactly the metrics of `ops/metrics.txt`, with their types and labels."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"
#: The modules that read settings from the environment: settings.py's loader and the
#: readers it calls for one group of settings.
SETTINGS_SOURCES = (ROOT / "carpool" / "core" / "settings.py",
                    ROOT / "carpool" / "core" / "webhook_settings.py",
                    ROOT / "carpool" / "core" / "bulk_settings.py",
                    ROOT / "carpool" / "core" / "api_keys.py")
METRICS_LIST = ROOT / "ops" / "metrics.txt"

#: The helpers in settings.py that take ``(env, NAME, ...)``.
_ENV_READERS = {"_int", "_port", "_flag", "_fraction", "_seconds"}
_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def table_after(heading: str) -> list[list[str]]:
    """The cells of each body row of the first table below ``heading``."""
    lines = REFERENCE.read_text().splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table under {heading!r}"
    return rows[2:]  # the header and the |---| line


def first_names(rows: list[list[str]]) -> list[str]:
    names = []
    for row in rows:
        found = _NAME.fullmatch(row[0])
        assert found, f"a row whose first cell is not one `NAME`: {row[0]!r}"
        names.append(found.group(1))
    return names


def settings_read() -> set[str]:
    """Every name settings.py looks up in ``env``: ``env.get(NAME)`` and ``_int(env, NAME)``."""
    names: set[str] = set()
    modules = [ast.parse(source.read_text()) for source in SETTINGS_SOURCES]
    # The readers themselves look up the name they are given; their callers name it.
    callers = [n for module in modules for n in module.body
               if not (isinstance(n, ast.FunctionDef) and n.name in _ENV_READERS)]
    for node in (n for top in callers for n in ast.walk(top)):
        if not isinstance(node, ast.Call):
            continue
        func, args = node.func, node.args
        if (isinstance(func, ast.Attribute) and func.attr == "get"
                and isinstance(func.value, ast.Name) and func.value.id == "env" and args):
            key = args[0]
        elif isinstance(func, ast.Name) and func.id in _ENV_READERS and len(args) > 1:
            key = args[1]
        else:
            continue
        assert isinstance(key, ast.Constant) and isinstance(key.value, str), (
            f"settings.py line {node.lineno} reads a name that is not a literal")
        names.add(key.value)
    return names


def metrics_listed() -> dict[str, tuple[str, str]]:
    listed: dict[str, tuple[str, str]] = {}
    for line in METRICS_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, labels = line.split()
            listed[name] = (kind, labels)
    return listed


def test_the_settings_parser_finds_what_the_loader_reads() -> None:
    read = settings_read()
    assert {"CARPOOL_REDIS_URL", "CARPOOL_LEASE_MS", "CARPOOL_DEVICE", "CARPOOL_GPU_CLAIM",
            "CARPOOL_GPU_FREE_WATERMARK", "CARPOOL_WORKER_METRICS_PORT"} <= read
    assert len(read) > 30


def test_every_setting_read_has_one_row_and_every_row_is_read() -> None:
    documented = first_names(table_after("## Settings"))
    assert len(documented) == len(set(documented)), "a setting with two rows"
    read = settings_read()
    missing = read - set(documented)
    assert not missing, f"read by settings.py but not in docs/reference.md: {missing}"
    assert not set(documented) - read, (
        f"in docs/reference.md but not read by settings.py: {set(documented) - read}")


def test_the_other_processes_variables_are_not_settings_and_exist() -> None:
    others = first_names(table_after("### Read by other processes"))
    assert not set(others) & settings_read()
    code = "".join(p.read_text() for folder in ("carpool", "web", "worker", "dispatcher", "feeder")
                   for p in (ROOT / folder).rglob("*.py"))
    for name in others:
        assert f'"{name}"' in code or f"'{name}'" in code, f"{name} is read nowhere"


def test_every_metric_listed_has_one_row_with_its_type_and_labels() -> None:
    rows = table_after("## Metrics")
    documented = first_names(rows)
    assert len(documented) == len(set(documented)), "a metric with two rows"
    listed = metrics_listed()
    assert not set(listed) - set(documented), (
        f"in ops/metrics.txt but not in docs/reference.md: {set(listed) - set(documented)}")
    assert not set(documented) - set(listed), (
        f"in docs/reference.md but not in ops/metrics.txt: {set(documented) - set(listed)}")
    for name, row in zip(documented, rows, strict=True):
        kind, labels = listed[name]
        assert row[1] == kind, f"{name}: the doc says {row[1]}, ops/metrics.txt {kind}"
        cell = row[2].strip("`").replace(" ", "")
        assert cell == ("—" if labels == "-" else labels), f"{name}: labels {row[2]}"


def test_every_rejection_reason_is_documented() -> None:
    from web.common.metrics import REASONS

    row = dict(zip(first_names(table_after("## Metrics")), table_after("## Metrics"),
                   strict=True))["carpool_jobs_rejected_total"]
    for reason in REASONS:
        assert f"`{reason}`" in row[3], reason
