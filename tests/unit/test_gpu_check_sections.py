"""ops/gpu/check.py's plan: every section in its time box, the slowest (served vs
offline) last, and the time boxes inside check.sh's bound for the whole."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "ops" / "gpu" / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)  # it puts ops/bench on sys.path: not for others
    finally:
        sys.path[:] = saved
    return module


def test_the_served_vs_offline_bench_runs_last_and_every_section_has_a_time_box() -> None:
    check = load_check()
    assert list(check.SECTIONS)[-1] == "bench"
    assert set(check.SECTION_BUDGET_S) == set(check.SECTIONS)
    script = (ROOT / "ops" / "gpu" / "check.sh").read_text()
    check_s = int(re.search(r"^CHECK_S=(\d+)$", script, re.M).group(1))  # type: ignore[union-attr]
    tests_s = int(re.search(r"^TESTS_S=(\d+)$", script, re.M).group(1))  # type: ignore[union-attr]
    assert sum(check.SECTION_BUDGET_S.values()) < check_s
    assert tests_s + check_s <= 300  # twice over in one 10-minute command


def test_a_section_past_its_time_box_is_stopped_with_a_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    check = load_check()
    never = threading.Event()

    def stuck(args: argparse.Namespace) -> dict[str, Any]:
        never.wait(30)
        return {}

    monkeypatch.setitem(check.SECTIONS, "device", stuck)
    monkeypatch.setitem(check.SECTION_BUDGET_S, "device", 0.2)
    with pytest.raises(check.SectionTimeout):
        check.run_section("device", argparse.Namespace(dry_run=True))
