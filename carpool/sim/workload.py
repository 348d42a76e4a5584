"""What arrives in a simulation: times (Poisson, bursts, a diurnal curve, a trace),
sizes, and optionally deadlines and priorities. Seeded: the same run every time.

Poisson and bursts are carpool bench's own generators (carpool.bench.arrivals),
so a simulated run and a real one can share a schedule.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from carpool.bench.arrivals import Bursts, burst_times, poisson_times
from carpool.bench.workload import SizeMix


@dataclass(frozen=True)
class SimArrival:
    """One job: seconds after the start, its size, its deadline (0: none), its priority."""

    t_s: float
    size: int
    deadline_ms: int = 0
    priority: int = 0


def diurnal_times(rate: float, duration_s: float, amplitude: float, period_s: float,
                  seed: int) -> list[float]:
    """Poisson with rate ``rate·(1 + amplitude·sin(2πt/period))``, by thinning."""
    if not 0 <= amplitude <= 1:
        raise ValueError(f"amplitude must be 0..1, got {amplitude}")
    rng = random.Random(seed)
    peak = rate * (1 + amplitude)
    times = []
    for t in poisson_times(peak, duration_s, seed):
        wanted = rate * (1 + amplitude * math.sin(2 * math.pi * t / period_s))
        if rng.random() * peak < wanted:
            times.append(t)
    return times


def schedule(times: Sequence[float], sizes: SizeMix, seed: int, *,
             deadlines_ms: Sequence[int] = (0,), priorities: Sequence[int] = (0,),
             ) -> list[SimArrival]:
    """Give each time a size, a deadline and a priority, each drawn uniformly from its list."""
    rng = random.Random(seed + 1)
    return [SimArrival(t, sizes.draw(rng), rng.choice(deadlines_ms), rng.choice(priorities))
            for t in times]


def arrivals(kind: str, rate: float, duration_s: float, sizes: SizeMix, seed: int, *,
             bursts: Bursts | None = None, amplitude: float = 0.8,
             deadlines_ms: Sequence[int] = (0,), priorities: Sequence[int] = (0,),
             ) -> list[SimArrival]:
    """A schedule of ``kind`` poisson | bursts | diurnal whose *mean* rate is ``rate``."""
    if kind == "poisson":
        times = poisson_times(rate, duration_s, seed)
    elif kind == "bursts":
        b = bursts or Bursts(factor=4.0, burst_s=1.0, period_s=10.0)
        times = burst_times(rate / b.mean_factor(), duration_s, b, seed)
    elif kind == "diurnal":
        times = diurnal_times(rate, duration_s, amplitude, duration_s, seed)
    else:
        raise ValueError(f"unknown arrivals {kind!r}: poisson, bursts or diurnal")
    return schedule(times, sizes, seed, deadlines_ms=deadlines_ms, priorities=priorities)


def load_trace(path: Path, sizes: SizeMix, seed: int) -> list[SimArrival]:
    """A recorded trace, one JSON object a line: carpool bench's records (``t_sched``,
    ``size``) or ``{"t", "size"?, "deadline_ms"?, "priority"?}``; sizes drawn if absent."""
    rng = random.Random(seed + 1)
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            t_s = float(item["t_sched"] if "t_sched" in item else item["t"])
            size = int(item["size"]) if "size" in item else sizes.draw(rng)
            out.append(SimArrival(t_s, size, int(item.get("deadline_ms", 0)),
                                  int(item.get("priority", 0))))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: not a trace line ({exc}): {line[:80]!r}") from None
    out.sort(key=lambda a: a.t_s)
    return out
