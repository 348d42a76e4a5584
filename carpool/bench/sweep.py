"""A series of runs against one target, one summary each: a sweep of rates, or one run.

Every step waits until its last job has ended (or the grace time has passed)
before the next one starts, so one step's backlog never leaks into the next.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NoReturn

from carpool.bench.arrivals import Arrival, Bursts, burst_times, poisson_times, with_sizes
from carpool.bench.records import JobRecord
from carpool.bench.scrape import fetch_buckets, quantile_bound, quantile_estimate
from carpool.bench.stats import Summary, summarize
from carpool.bench.target import Target
from carpool.bench.workload import SizeMix
from carpool.core.extras import require

if TYPE_CHECKING:
    from tqdm import tqdm

#: Jobs sent (and not counted) before the first step: new connections, a cold
#: gunicorn worker or a first Redis script load must not land in the first step.
WARMUP_JOBS = 40
WARMUP_S = 1.0

#: The default sweep, as fractions of capacity (the issue asks for 25 %–110 %).
DEFAULT_FRACTIONS = (0.25, 0.5, 0.65, 0.8, 0.9, 1.0, 1.1)


@dataclass(frozen=True)
class Step:
    label: str
    arrivals: list[Arrival]
    #: The schedule's length, for the offered rate; None for a backlog (all at once).
    duration_s: float | None
    extra: dict[str, float | str] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    summary: Summary
    records: list[JobRecord]


def poisson_step(label: str, rate: float, duration_s: float, sizes: SizeMix, seed: int,
                 bursts: Bursts | None = None) -> Step:
    """Poisson arrivals at ``rate`` (the *base* rate when ``bursts`` is given)."""
    times = (burst_times(rate, duration_s, bursts, seed) if bursts
             else poisson_times(rate, duration_s, seed))
    return Step(label, with_sizes(times, sizes, seed), duration_s, {"rate": rate})


def fraction_steps(capacity: float, fractions: Sequence[float], duration_s: float,
                   sizes: SizeMix, seed: int) -> list[Step]:
    """One Poisson step per fraction of ``capacity`` (jobs/s), each with its own seed."""
    steps = []
    for i, f in enumerate(fractions):
        step = poisson_step(f"{f:.0%}", f * capacity, duration_s, sizes, seed + 7919 * i)
        steps.append(replace(step, extra={**step.extra, "fraction": f}))
    return steps


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic GC while a step runs: its full passes over the growing heap of
    records stalled the schedule by tens of ms, and the drivers make few cycles."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def run_steps(target: Target, steps: Sequence[Step], nonce: str, grace_s: float,
              bar: tqdm[NoReturn] | None = None) -> list[StepResult]:
    """Drive each step in turn (after a warm-up); ``bar`` advances by one per job that ends."""
    warmup = [Arrival(i * WARMUP_S / WARMUP_JOBS, step.arrivals[0].size)
              for i in range(WARMUP_JOBS) for step in steps[:1] if step.arrivals]
    if warmup:
        target.drive(warmup, f"{nonce}-warmup", grace_s, lambda: None)
    out = []
    for step in steps:
        if bar is not None:
            bar.set_description(f"{target.label} {step.label}")

        def tick() -> None:
            if bar is not None:
                bar.update(1)

        scrape = target.transport == "http" and bool(target.base_url)
        before = fetch_buckets(target.base_url) if scrape else None
        with collector_paused():
            records = target.drive(step.arrivals, f"{nonce}-{target.label}-{step.label}",
                                   grace_s, tick)
        after = fetch_buckets(target.base_url) if before is not None else None
        summary = summarize(f"{target.label} {step.label}", records, step.duration_s)
        extra: dict[str, float | str] = {"target": target.label,
                                         "transport": target.transport, **step.extra}
        if before is not None and after is not None:
            # The web's own time for this step's 429s, to its histogram's bucket bounds.
            bound_s, n = quantile_bound(before, after, 0.99)
            extra["server_429s"] = n
            extra["server_429_p99_le_ms"] = bound_s * 1000.0
            extra["server_429_p99_est_ms"] = quantile_estimate(before, after, 0.99) * 1000.0
        if target.limit_per_s:
            extra["limit_per_s"] = target.limit_per_s
        out.append(StepResult(replace(summary, extra=extra), records))
    return out


def progress_bar(total: int) -> tqdm[NoReturn]:
    """The progress bar on stderr: one tick per job that ends (tqdm: the bench extra)."""
    bar: tqdm[NoReturn] = require("tqdm").tqdm(total=total, unit="job", mininterval=0.5,
                                              dynamic_ncols=True, leave=False)
    return bar
