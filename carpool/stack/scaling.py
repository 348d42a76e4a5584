"""`carpool up --workers MIN..MAX`: how many worker processes to run, and which to stop.

Pure (a clock passed in, no Redis, no processes): carpool/stack/autoscaler.py feeds it
what the scaling gauges read (carpool/backend/need_gauges.py) and acts on its answer.

- The wish is the largest ``workers_needed`` over the models (every local worker serves
  every model it can), clamped to MIN..MAX.
- **Up at once**: a worker missing now costs deadlines a cold start later.
- **Down after a hold-down**: to the largest wish of the last ``hold_down_s``, never
  below MIN nor below the workers that cannot stop now (starting, loading, holding a
  lease). Why hold down: the arrival rate the rule reads is a 30 s decayed mean, so a
  lull shorter than that is noise, and a worker stopped in a lull and started again
  pays a process start and a model load (the cold start) while callers wait; 30 s
  keeps the pool for a pause between waves and still returns to MIN about a minute
  after the load ends (the rate's decay, then the hold-down).
- **Which stop**: idle workers only, the newest first (the first ones keep their warm
  caches and their metrics ports).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from carpool.core.errors import ConfigError
from carpool.scheduling.need import ModelLoad, Need, work_ahead_ms, workers_needed

HOLD_DOWN_S = 30.0


@dataclass(frozen=True)
class Bounds:
    low: int
    high: int

    @property
    def scaling(self) -> bool:
        return self.high > self.low


def parse_workers(text: str) -> Bounds:
    """``N`` (N..N: a fixed pool, as before) or ``MIN..MAX``."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?", text)
    if not m:
        raise ConfigError(f"--workers {text!r}: give a count (2) or a range MIN..MAX (1..3)")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) is not None else low
    if high < low:
        raise ConfigError(f"--workers {text!r}: MAX ({high}) is below MIN ({low})")
    if high < 1:
        raise ConfigError(f"--workers {text!r}: MAX must be at least 1")
    return Bounds(low, high)


@dataclass(frozen=True)
class PoolWorker:
    """One worker process of the pool: its node name ("worker2") and whether it can be
    stopped now (not starting, not loading, holding no lease)."""

    name: str
    index: int
    idle: bool


@dataclass(frozen=True)
class Decision:
    start: int
    stop: tuple[str, ...]
    target: int
    #: Why, in words: the model that set the wish and the rule's reason.
    why: str


def explain(model: str, need: Need, load: ModelLoad) -> str:
    depth = sum(b.depth for b in load.bins)
    rate_s = 1000 * sum(b.arrivals_per_ms for b in load.bins)
    return (f"{model} needs {need.workers} ({need.why}: {depth} queued, "
            f"{work_ahead_ms(load.bins) / 1000:.1f} s of work ahead, {rate_s:.0f} jobs/s "
            f"arriving, {load.up} up, {load.busy} busy, {load.loading} loading, cold start "
            f"{load.cold_start_ms / 1000:.1f} s; {need.misses_projected} misses projected)")


def wish(loads: Mapping[str, ModelLoad]) -> tuple[int, str]:
    """The workers the neediest model needs, and why (the first model on a tie)."""
    best, why = 0, "no model needs a worker (idle)"
    for model, load in loads.items():
        need = workers_needed(load)
        if need.workers > best:
            best, why = need.workers, explain(model, need, load)
    return best, why


@dataclass
class Scaler:
    bounds: Bounds
    hold_down_s: float = HOLD_DOWN_S
    _wishes: deque[tuple[float, int]] = field(default_factory=deque)
    _last_start_s: float | None = None

    def decide(self, now_s: float, wanted: int, why: str,
               pool: Sequence[PoolWorker]) -> Decision:
        """What to do now, given the wish and the pool (stopping workers left out)."""
        if self._last_start_s is None:
            self._last_start_s = now_s  # the pool at start is as good as just started
        self._wishes.append((now_s, wanted))
        while self._wishes and now_s - self._wishes[0][0] > self.hold_down_s:
            self._wishes.popleft()
        running = len(pool)
        up_to = min(self.bounds.high, max(self.bounds.low, wanted))
        if up_to > running:
            self._last_start_s = now_s
            return Decision(up_to - running, (), up_to, why)
        if now_s - self._last_start_s < self.hold_down_s:
            return Decision(0, (), running, why)  # a worker just started: hold
        held = max(w for _, w in self._wishes)
        pinned = sum(not w.idle for w in pool)
        down_to = max(self.bounds.low, min(self.bounds.high, held), pinned)
        if down_to >= running:
            return Decision(0, (), running, why)
        idle = sorted((w for w in pool if w.idle), key=lambda w: -w.index)
        stop = tuple(w.name for w in idle[:running - down_to])
        return Decision(0, stop, running - len(stop),
                        f"{why}; the most needed over the last {self.hold_down_s:.0f} s: "
                        f"{held}")
