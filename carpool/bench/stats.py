"""The arithmetic of a run: percentiles, the summary, the knee of a sweep. Pure.

Percentiles interpolate linearly between the closest ranks (numpy's default,
"type 7"), so p50 of [1, 2, 3, 4] is 2.5 and p100 is the maximum.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from carpool.bench.records import JobRecord, Outcome

#: Parts of a result's timings_ms, in the order they happen.
SPLIT = ("queue", "preprocess", "inference", "total")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``; NaN when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Latency:
    p50: float
    p95: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency:
        mean = sum(values) / len(values) if values else math.nan
        p50, p95, p99, top = (percentile(values, q) for q in (50, 95, 99, 100))
        return cls(p50, p95, p99, top, mean)


def batch_histogram(records: Sequence[JobRecord]) -> dict[int, int]:
    """How many *batches* of each size: a batch of n shows up in n job records."""
    jobs = Counter(r.batch_size for r in records if r.batch_size > 0)
    return {size: round(n / size) for size, n in sorted(jobs.items())}


def server_rate(records: Sequence[JobRecord]) -> float | None:
    """Jobs done per second on Redis's clock, first admission to last completion."""
    done = [r for r in records if r.outcome is Outcome.OK and r.server_done_ms is not None]
    admits = [r.server_admit_ms for r in done if r.server_admit_ms is not None]
    if len(done) < 2 or not admits:
        return None
    span_ms = max(r.server_done_ms or 0 for r in done) - min(admits)
    return len(done) / (span_ms / 1000.0) if span_ms > 0 else None


def steady_rate(records: Sequence[JobRecord]) -> float | None:
    """Jobs done per second between the first and the last completion (Redis clock).

    The jobs of the first completed batch finished *at* the window's start, so
    they are left out: for a backlog this is the saturated rate, free of the
    first batch's wait and of the admission phase's start.
    """
    done = sorted(r.server_done_ms for r in records
                  if r.outcome is Outcome.OK and r.server_done_ms is not None)
    if len(done) < 2 or done[-1] == done[0]:
        return None
    first_batch = done.count(done[0])
    return (len(done) - first_batch) / ((done[-1] - done[0]) / 1000.0)


@dataclass(frozen=True)
class Summary:
    """One run at one offered rate (``offered_rate`` None: all jobs at once)."""

    label: str
    jobs: int
    offered_rate: float | None
    achieved_rate: float
    counts: dict[str, int]
    e2e_ms: Latency
    #: Mean of each part of the results' timings_ms.
    split_ms: dict[str, float]
    batches: dict[int, int]
    lateness_p99_ms: float
    server_rate: float | None = None
    steady_rate: float | None = None
    #: How long a refusal (429) took to come back, from the scheduled arrival, p99.
    rejected_p99_ms: float = math.nan
    extra: dict[str, float | str] = field(default_factory=dict)

    @property
    def mean_batch(self) -> float:
        n = sum(self.batches.values())
        return sum(s * c for s, c in self.batches.items()) / n if n else math.nan

    @property
    def delivered(self) -> float:
        """Achieved as a fraction of offered (1.0 when nothing was offered by rate)."""
        if not self.offered_rate:
            return 1.0
        return self.achieved_rate / self.offered_rate


def summarize(
    label: str, records: Sequence[JobRecord], duration_s: float | None
) -> Summary:
    """Summarize one run; ``duration_s`` is the schedule's length (None: a backlog).

    Achieved rate: ok results over the longer of the schedule and the span of
    their arrivals back at the driver. Below capacity results come back over
    the schedule's length, so it is ok / duration, with no bias from the last
    jobs' latency; above it they keep coming after the schedule ends, and it is
    the rate they came back at. A backlog's span starts at time zero.
    """
    ok = [r for r in records if r.outcome is Outcome.OK]
    finals = [r.t_final for r in ok if r.t_final is not None]
    span = 0.0
    if finals:
        start = min(finals) if duration_s else min(r.t_sched for r in records)
        span = max(max(finals) - start, duration_s or 0.0)
    achieved = len(ok) / span if span > 0 else 0.0
    offered = len(records) / duration_s if duration_s else None
    counts = Counter(r.outcome.value for r in records)
    split = {
        part: sum(r.timings_ms.get(part, 0.0) for r in ok) / len(ok) if ok else math.nan
        for part in SPLIT
    }
    return Summary(
        label=label,
        jobs=len(records),
        offered_rate=offered,
        achieved_rate=achieved,
        counts={o.value: counts.get(o.value, 0) for o in Outcome},
        e2e_ms=Latency.of([r.e2e_ms for r in ok if r.e2e_ms is not None]),
        split_ms=split,
        batches=batch_histogram(records),
        lateness_p99_ms=percentile([r.lateness_ms for r in records], 99),
        server_rate=server_rate(records),
        steady_rate=steady_rate(records),
        rejected_p99_ms=percentile([r.e2e_ms for r in records if r.outcome is Outcome.REJECTED
                                    and r.e2e_ms is not None], 99),
    )


@dataclass(frozen=True)
class KneeRule:
    """A point is healthy when it delivers what was offered at a tail near the unloaded one.

    Healthy: achieved >= ``min_delivered`` × offered, and p99 <= ``k`` × the p99
    of the lowest offered rate. The knee is the last healthy point of the
    leading run of healthy points, in order of offered rate: the highest load
    before the curve first bends up (or throughput first falls behind).
    """

    k: float = 2.0
    min_delivered: float = 0.95

    def healthy(self, s: Summary, base_p99_ms: float) -> bool:
        return s.delivered >= self.min_delivered and s.e2e_ms.p99 <= self.k * base_p99_ms


def find_knee(points: Sequence[Summary], rule: KneeRule = KneeRule()) -> Summary | None:
    """The knee of a sweep by ``rule``; None when even the lowest rate is unhealthy."""
    ordered = sorted((p for p in points if p.offered_rate), key=lambda p: p.offered_rate or 0.0)
    if not ordered:
        return None
    base = ordered[0].e2e_ms.p99
    knee: Summary | None = None
    for point in ordered:
        if not rule.healthy(point, base):
            break
        knee = point
    return knee
