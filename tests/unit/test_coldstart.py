"""A worker's cold start: process start (from the kernel) to each model's first batch."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from carpool.core.jobs import Claim
from worker.loop.observers import BatchReport
from worker.observe.coldstart import ColdStart, process_start_s


def report(model: str) -> BatchReport:
    return BatchReport(model, "small", 1, failed=0, refused=0, runtime_s=0.1,
                       inference_ms=1.0, queue_ms=[0])


def test_the_first_batch_of_each_model_sets_its_cold_start_once() -> None:
    registry = CollectorRegistry()
    now = [130.0]
    told: list[tuple[str, float]] = []
    cold = ColdStart(registry, started_s=100.0, on_measured=lambda m, s: told.append((m, s)),
                     clock=lambda: now[0])
    claim = Claim("synthetic", "small", "t", 0, ())
    cold.on_finished(claim, report("synthetic"))
    now[0] = 200.0
    cold.on_finished(claim, report("synthetic"))  # not the first: no change
    cold.on_finished(claim, report("texts"))
    assert told == [("synthetic", 30.0), ("texts", 100.0)]
    value = registry.get_sample_value
    assert value("carpool_worker_cold_start_seconds", {"model": "synthetic"}) == 30.0
    assert value("carpool_worker_cold_start_seconds", {"model": "texts"}) == 100.0


def test_the_process_start_is_read_from_the_kernel(tmp_path: Path) -> None:
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # Field 22 is starttime; the command name may hold spaces and parentheses.
    stat.write_text("42 (my (odd) cmd) S " + " ".join(["0"] * 18) + " 500 0 0\n")
    uptime = tmp_path / "uptime"
    uptime.write_text("1000.0 5.0\n")
    started = process_start_s(str(stat), str(uptime), now_s=lambda: 0.0)
    assert started == -1000.0 + 500 * tick_s
    # Unreadable: the module's import time, which the kernel's start never follows.
    imported = process_start_s(str(tmp_path / "none"), str(uptime))
    assert process_start_s() <= imported <= time.time()
