"""What a simulated run measured: latency percentiles, throughput, batch sizes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from carpool.sim.engine import SimResult


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (nan when empty)."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Summary:
    jobs: int
    done: int
    expired: int
    rejected: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    #: Completed jobs per second, from the first arrival to the last completion.
    throughput_per_s: float
    mean_batch: float

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def summarize(result: SimResult) -> Summary:
    done = [j for j in result.jobs if j.status == "done"]
    lat = sorted(j.latency_ms for j in done)
    span_us = (max(j.done_us for j in done) - min(j.admit_us for j in result.jobs)) if done else 0
    sizes = [b.size for b in result.batches]
    return Summary(
        jobs=len(result.jobs), done=len(done),
        expired=sum(j.status == "expired" for j in result.jobs),
        rejected=sum(j.status == "rejected" for j in result.jobs),
        p50_ms=percentile(lat, 50), p90_ms=percentile(lat, 90), p99_ms=percentile(lat, 99),
        max_ms=lat[-1] if lat else math.nan,
        throughput_per_s=len(done) / (span_us / 1e6) if span_us > 0 else 0.0,
        mean_batch=sum(sizes) / len(sizes) if sizes else 0.0,
    )
