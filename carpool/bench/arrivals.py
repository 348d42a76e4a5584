"""When jobs arrive: Poisson at a rate, repeating bursts, a diurnal curve, or a trace.

Every schedule is a list of ``Arrival`` sorted by time, fixed before the run
starts (open loop: arrivals follow the clock, never completions), and the same
for the same seed. ``carpool bench`` drives real stacks with these schedules and
the simulator (``carpool.sim``) replays the same ones, so a simulated run and a
real one can share a schedule and a trace file. The simulator imports this
module; nothing here imports the simulator.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carpool.bench.workload import SizeMix


@dataclass(frozen=True)
class Arrival:
    """One job: when it is submitted (seconds after the start), its size, any payload,
    its deadline (0: none) and its priority."""

    t_s: float
    size: int
    payload: Any = None
    deadline_ms: int = 0
    priority: int = 0


@dataclass(frozen=True)
class Bursts:
    """``factor`` × the base rate for ``burst_s`` at the end of every ``period_s``."""

    factor: float
    burst_s: float
    period_s: float

    def __post_init__(self) -> None:
        if self.factor <= 0 or not 0 < self.burst_s <= self.period_s:
            raise ValueError(
                f"bursts need factor > 0 and 0 < burst_s ({self.burst_s}) <= "
                f"period_s ({self.period_s})"
            )

    def mean_factor(self) -> float:
        """The mean rate over a period, as a multiple of the base rate."""
        return 1.0 + (self.factor - 1.0) * self.burst_s / self.period_s


def _poisson_times(rng: random.Random, rate: float, start_s: float, end_s: float) -> list[float]:
    # Exponential gaps are memoryless, so restarting at a segment boundary is exact.
    times: list[float] = []
    if rate <= 0:
        return times
    t = start_s + rng.expovariate(rate)
    while t < end_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def poisson_times(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process of ``rate`` per second over ``duration_s``."""
    return _poisson_times(random.Random(seed), rate, 0.0, duration_s)


def burst_times(rate: float, duration_s: float, bursts: Bursts, seed: int) -> list[float]:
    """Poisson at ``rate``, and at ``bursts.factor × rate`` during each burst."""
    rng = random.Random(seed)
    times: list[float] = []
    start = 0.0
    while start < duration_s:
        calm_end = min(start + bursts.period_s - bursts.burst_s, duration_s)
        times += _poisson_times(rng, rate, start, calm_end)
        burst_end = min(start + bursts.period_s, duration_s)
        times += _poisson_times(rng, rate * bursts.factor, calm_end, burst_end)
        start += bursts.period_s
    return times


def with_sizes(times: list[float], sizes: SizeMix, seed: int) -> list[Arrival]:
    """Give each arrival a size; a separate stream, so times never depend on the mix."""
    rng = random.Random(seed + 1)
    return [Arrival(t, sizes.draw(rng)) for t in times]


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
             ) -> list[Arrival]:
    """Give each time a size, a deadline and a priority, each drawn uniformly from its list."""
    rng = random.Random(seed + 1)
    return [Arrival(t, sizes.draw(rng), deadline_ms=rng.choice(deadlines_ms),
                    priority=rng.choice(priorities)) for t in times]


def arrivals(kind: str, rate: float, duration_s: float, sizes: SizeMix, seed: int, *,
             bursts: Bursts | None = None, amplitude: float = 0.8,
             deadlines_ms: Sequence[int] = (0,), priorities: Sequence[int] = (0,),
             ) -> list[Arrival]:
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


def load_trace(path: Path, sizes: SizeMix, seed: int) -> list[Arrival]:
    """A trace file: one JSON object per line, ``{"t": s, "size"?: n, "value"?: any,
    "deadline_ms"?: n, "priority"?: n}``, or carpool bench's own records (their
    ``t_sched`` and ``size``).

    A bare number on a line is a time alone. Missing sizes are drawn from
    ``sizes``; a ``value`` travels as the job's payload (the driver still makes
    every job's value unique, so a misrouted result stays detectable).
    """
    rng = random.Random(seed + 1)
    out: list[Arrival] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if isinstance(item, (int, float)):
                item = {"t": item}
            t_s = float(item["t_sched"] if "t_sched" in item else item["t"])
            size = int(item["size"]) if "size" in item else sizes.draw(rng)
            out.append(Arrival(t_s, size, item.get("value"), int(item.get("deadline_ms", 0)),
                               int(item.get("priority", 0))))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: not a trace line ({exc}): {line[:80]!r}") from None
    out.sort(key=lambda a: a.t_s)
    return out


def all_at_once(n: int, sizes: SizeMix, seed: int) -> list[Arrival]:
    """``n`` arrivals at time zero: the drain mode's backlog."""
    return with_sizes([0.0] * n, sizes, seed)
