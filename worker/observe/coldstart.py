"""A worker's cold start: process start to its first batch of each model.

``carpool_worker_cold_start_seconds{model}`` on the worker's metrics port, and the
same seconds in its registry entry (worker/shell/presence.py), where the scaling rule
reads them (carpool/backend/need_gauges.py): how long a worker started now takes to
help. Measured from the process's start as the kernel recorded it (Linux's
``/proc/self/stat``), so the interpreter's start and imports count; elsewhere from
this module's import. A container's image pull and scheduling come before the process
and are not in it: the rule's default (``CARPOOL_COLD_START_S``) is the floor for them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from carpool.core.jobs import Claim
from worker.loop.observers import BatchReport, Observer

log = logging.getLogger(__name__)

_IMPORTED_S = time.time()


def process_start_s(stat_path: str = "/proc/self/stat", uptime_path: str = "/proc/uptime",
                    now_s: Callable[[], float] = time.time) -> float:
    """This process's start, epoch seconds: from the kernel where it says, else the import
    of this module."""
    try:
        with open(stat_path) as f:
            # Field 22 (starttime, clock ticks after boot); split after the ")" of the
            # command name, which may hold spaces.
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open(uptime_path) as f:
            uptime_s = float(f.read().split()[0])
        started = now_s() - uptime_s + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED_S
    return min(started, _IMPORTED_S)


class ColdStart(Observer):
    """Records each model's first batch once: the gauge, and ``on_measured`` (the
    presence's ``cold_start``)."""

    def __init__(self, registry: CollectorRegistry, started_s: float,
                 on_measured: Callable[[str, float], object] = lambda model, s: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.started_s = started_s
        self.on_measured = on_measured
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.gauge = Gauge("carpool_worker_cold_start_seconds",
                           "This worker's process start to its first batch of the model.",
                           ("model",), registry=registry)

    def on_finished(self, claim: Claim, report: BatchReport) -> None:
        if report.model in self.seconds:
            return
        seconds = max(0.0, self.clock() - self.started_s)
        self.seconds[report.model] = seconds
        self.gauge.labels(report.model).set(seconds)
        log.info("cold start of %s: %.1f s from process start to its first batch",
                 report.model, seconds)
        self.on_measured(report.model, seconds)
