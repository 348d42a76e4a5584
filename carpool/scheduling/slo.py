"""A p99 target per model: a bin's max_batch shrinks multiplicatively while the
p99 latency its worker sees is above the target, and grows additively while it
is met (AIMD, as Clipper does for its batch size).

Latency here is admission to results written, as the worker sees it. Shrinking
batches helps when long batches make the tail; it cannot help a backlogged bin,
whose tail is its queue: smaller batches would drain it slower still. So:

- only batches that were *held* — the worker was idle, waiting for the bin to
  fill or fall due — can leave sooner with a smaller cap; a miss while most
  batches were not held (they waited for a busy worker, or behind other bins)
  leaves the cap alone;
- a miss while most batches left a whole batch's worth of jobs behind (a
  backlog) lifts the cap altogether;
- the cap never goes below ``KEEP_UP_MARGIN`` times the batch size that keeps up
  with the arrival rate, n ≥ λa / (1 − λb) — the batch whose service time
  covers its own arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from carpool.scheduling.batching import Cost

#: Latencies per verdict: a p99 of fewer would be one job's luck.
WINDOW_JOBS = 200
#: A missed target multiplies the cap by this ...
DECREASE = 0.75
#: ... a met one adds this.
INCREASE = 1
#: The cap stays this many times above the batch size that just keeps up.
KEEP_UP_MARGIN = 1.5
#: A window where at least this share of batches left jobs behind was a backlog;
#: one where at least this share was held can be helped by a smaller cap.
MAJORITY = 0.5


def p99(values: list[float]) -> float:
    """The 99th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def keep_up_batch(cost: Cost | None, arrivals_per_ms: float, ceiling: int) -> int:
    """The smallest batch size whose service keeps up with the arrivals (>= 1)."""
    if cost is None or arrivals_per_ms <= 0:
        return 1
    spare = 1.0 - arrivals_per_ms * cost.b_ms
    if spare <= 0:
        return ceiling  # even the largest batch is not enough: do not shrink at all
    needed = KEEP_UP_MARGIN * arrivals_per_ms * cost.a_ms / spare
    return max(1, min(ceiling, math.ceil(needed)))


@dataclass
class BatchCap:
    """The SLO's cap on one bin's max_batch; ``cap`` is None while no target is set."""

    cap: int | None = None
    last_p99_ms: float | None = None
    _window: list[float] = field(default_factory=list)
    _batches: int = 0
    _behind: int = 0
    _held: int = 0

    def reset(self) -> None:
        self.cap, self.last_p99_ms = None, None
        self._window.clear()
        self._batches = self._behind = self._held = 0

    def limit(self, max_batch: int) -> int:
        """The max_batch to use now: the configured one, or the cap when it is lower."""
        return max_batch if self.cap is None else min(self.cap, max_batch)

    def observe(self, latencies_ms: list[float], target_ms: int, ceiling: int, floor: int,
                left_behind: bool = False, held: bool = True) -> None:
        """Count one batch's latencies; every WINDOW_JOBS, move the cap. ``left_behind``:
        its bin held another batch's worth of jobs when it left; ``held``: the worker
        had been waiting for it."""
        if target_ms <= 0:
            self.reset()
            return
        cap = ceiling if self.cap is None else min(self.cap, ceiling)
        self._window.extend(latencies_ms)
        self._batches += 1
        self._behind += left_behind
        self._held += held
        if len(self._window) < WINDOW_JOBS:
            return
        self.last_p99_ms = p99(self._window)
        backlog = self._behind >= MAJORITY * self._batches
        held = self._held >= MAJORITY * self._batches
        self._window.clear()
        self._batches = self._behind = self._held = 0
        if self.last_p99_ms <= target_ms:
            cap += INCREASE
        elif backlog:
            cap = ceiling  # a queue, not a batch, made the tail: never throttle a backlog
        elif held:
            cap = math.floor(cap * DECREASE)
        self.cap = max(min(floor, ceiling), 1, min(cap, ceiling))
