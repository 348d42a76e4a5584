"""How many workers a model needs so that its queued and arriving work meets its
deadlines: the rule the autoscaler scales on (docs/operations.md, "Scaling").

Pure: numbers in, numbers out, no clock of its own. Per model:

- **work ahead** W, in device-ms of one worker: each bin's depth d in full batches at
  its fitted cost t(n) = a + b·n, ``ceil(d / max_batch)·a + d·b``;
- **arrival load** ρ, in workers: each bin's arrivals at the cost of a full batch per
  job, ``λ·t(N)/N``; a pool kept at ``ρ / TARGET_UTILIZATION`` keeps up;
- **horizon** H: the queued work must be done by the later of the slack to the
  earliest deadline and the budget of a job admitted now (its deadline, else
  ``max_queue_ms``): the newest job's time bound. Workers up now work all of H; a
  worker started now works ``H − cold start``. When H is shorter than the cold start no
  new worker can help what is queued: the rule sizes for the horizon ``cold start +
  budget`` instead, and the queued jobs count as projected misses.

**Demand admission hides.** Admission refuses what the live workers cannot finish in
time, so a surge shows as a queue held near that bound and an admitted rate near
their pace, never as itself. Refusals for capacity, where known
(``refused_per_ms``), count as arrivals; and a queue whose work per live worker is at
``SATURATED`` of the budget is taken as refusing: the pool doubles (once the workers
already starting are up).

So ``workers needed`` is the smallest k with
``up·H + (k − up)·(H − cold start) ≥ W + ρ·H``, at least ``ρ / TARGET_UTILIZATION``,
never above one worker per queued batch beyond that, and never below the workers
holding leases or loading (a scale-down never takes a worker mid-batch or mid-load).
Any queued job or arrival with no worker up or loading needs at least 1: the rule
never divides by a worker count, so zero workers is a state like any other.

**Projected misses**: the queued jobs that the workers up now (and those loading,
once their cold start is over; at least one starting now when there are none) would
finish after their deadline, the deadlines spread evenly from the earliest (head) to
the budget (tail), jobs served in order at those workers' full-batch pace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from carpool.scheduling.batching import Cost

#: The busy share a pool is sized for: at 1.0 any burst grows a queue.
TARGET_UTILIZATION = 0.85
#: A horizon is never shorter than this after a cold start (a budget of 0: no time bound).
MIN_HORIZON_MS = 1_000.0
#: Below a job a minute, with nothing queued, a model keeps no worker: a decayed rate
#: never reaches 0 by itself, and the next job scales from zero.
MIN_ARRIVALS_PER_MS = 1 / 60_000
#: Work ahead per live worker at this share of the budget: admission is refusing. Under
#: admit.lua's share of a deadline (0.7, its own batch counted), which a queue never passes.
SATURATED = 0.6
#: Projected misses are counted over at most this many steps of the queue.
MISS_STEPS = 200


@dataclass(frozen=True)
class BinLoad:
    """One bin: its queue, its batch limit, its fitted cost (None: never measured) and
    its arrival rate."""

    depth: int
    max_batch: int
    cost: Cost | None
    arrivals_per_ms: float = 0.0
    #: Jobs refused for capacity (the predicted wait, a full bin) per ms, where known.
    refused_per_ms: float = 0.0

    def work_ms(self) -> float:
        if self.cost is None or self.depth <= 0:
            return 0.0
        n = max(1, self.max_batch)
        return math.ceil(self.depth / n) * self.cost.a_ms + self.depth * self.cost.b_ms

    def load_workers(self) -> float:
        """Workers kept busy by the arrivals, at full batches."""
        per_ms = self.arrivals_per_ms + self.refused_per_ms
        if self.cost is None or per_ms <= 0:
            return 0.0
        n = max(1, self.max_batch)
        return per_ms * self.cost.ms(n) / n


@dataclass(frozen=True)
class ModelLoad:
    """Everything the rule knows of one model at one instant."""

    bins: Sequence[BinLoad]
    #: To the earliest deadline of a queued job (its deadline, else its admission plus
    #: max_queue_ms), from now; None: no queued job has a time bound.
    slack_ms: float | None
    #: A job admitted now may take this long (its model's default deadline, else
    #: max_queue_ms); 0: no time bound.
    budget_ms: float
    #: Process start to first batch, as measured (or assumed before any was).
    cold_start_ms: float
    #: Workers serving the model now; of those, holding leases; still loading it.
    up: int = 0
    busy: int = 0
    loading: int = 0


@dataclass(frozen=True)
class Need:
    workers: int
    misses_projected: int
    #: Which bound set ``workers``: "idle", "floor", "from zero", "arrivals",
    #: "deadlines", "saturated", "unknown cost".
    why: str


def work_ahead_ms(bins: Sequence[BinLoad]) -> float:
    return sum(b.work_ms() for b in bins)


def load_workers(bins: Sequence[BinLoad]) -> float:
    return sum(b.load_workers() for b in bins)


def workers_needed(m: ModelLoad) -> Need:
    """The rule (module docstring)."""
    depth = sum(max(0, b.depth) for b in m.bins)
    arriving = sum(b.arrivals_per_ms + b.refused_per_ms for b in m.bins) >= MIN_ARRIVALS_PER_MS
    floor = max(0, m.busy) + max(0, m.loading)
    if depth == 0 and not arriving:
        return Need(floor, 0, "floor" if floor else "idle")
    rho = load_workers(m.bins)
    steady = math.ceil(rho / TARGET_UTILIZATION - 1e-9) if rho > 0 else 0
    need, why = steady, "arrivals"
    if any(b.cost is None and (b.depth > 0 or b.arrivals_per_ms + b.refused_per_ms > 0)
           for b in m.bins):
        need, why = max(need, 1), "unknown cost"
    work = work_ahead_ms(m.bins)
    up = max(0, m.up)
    timed = m.slack_ms is not None or m.budget_ms > 0  # else any worker drains it in time
    if work > 0 and timed:
        deadline = _for_deadlines(work, rho, up, m)
        cap = up + sum(math.ceil(b.depth / max(1, b.max_batch)) for b in m.bins) + steady
        deadline = min(deadline, cap)
        if deadline > need:
            need, why = deadline, "deadlines"
        if up and m.budget_ms > 0 and work >= SATURATED * m.budget_ms * up:
            doubled = 2 * up if m.loading <= 0 else up + m.loading
            if doubled > need:
                need, why = doubled, "saturated"
    if need < 1 and up + m.loading == 0:
        need, why = 1, "from zero"
    need = max(need, 1)  # something is queued or arriving
    if floor > need:
        need, why = floor, "floor"
    return Need(need, _misses(work, depth, rho, m), why)


def _horizon_ms(m: ModelLoad) -> float:
    """When the queued work must be done; past the cold start when it ends sooner."""
    horizon = max(m.slack_ms or 0.0, m.budget_ms)
    # Within a millisecond of the cold start (or of zero: a budget of 1e-308 ms) the
    # division by H − cold start in _for_deadlines overflows: size past the cold start.
    if horizon < m.cold_start_ms + 1.0:
        horizon = m.cold_start_ms + max(m.budget_ms, MIN_HORIZON_MS)
    return horizon


def _for_deadlines(work_ms: float, rho: float, up: int, m: ModelLoad) -> int:
    """The smallest k with up·H + (k − up)·(H − cold start) >= W + ρ·H."""
    horizon = _horizon_ms(m)
    required = work_ms + rho * horizon
    if up * horizon >= required:
        return math.ceil(required / horizon - 1e-9)  # fewer than up may do
    added = (required - up * horizon) / (horizon - m.cold_start_ms)  # H > cold start
    return up + math.ceil(added - 1e-9)


def _misses(work_ms: float, depth: int, rho: float, m: ModelLoad) -> int:
    """Queued jobs the workers up and loading now would finish after their deadlines."""
    if depth == 0 or m.slack_ms is None:
        return 0  # an unknown cost (work 0) still makes late what is due before a cold start
    now_workers = max(0, m.up)
    later = max(0, m.loading) if (m.up or m.loading) else 1
    head = max(0.0, m.slack_ms)
    tail = max(head, m.budget_ms)
    per_job_ms = work_ms / depth
    steps = min(depth, MISS_STEPS)
    late = 0
    for i in range(1, steps + 1):
        jobs_before = depth * i / steps
        deadline = head + (tail - head) * (i - 1) / max(1, steps - 1)
        if _finish_ms(jobs_before * per_job_ms, rho, now_workers, later,
                      m.cold_start_ms) > deadline:
            late += 1
    return round(depth * late / steps)


def _finish_ms(work_ms: float, rho: float, now_workers: int, later_workers: int,
               cold_start_ms: float) -> float:
    """When ``work_ms`` of queued work is done: ``now_workers`` from now and
    ``later_workers`` from the cold start on, less what the arrivals take (ρ)."""
    early_rate = max(0.0, now_workers - rho)
    if early_rate > 0 and early_rate * cold_start_ms >= work_ms:
        return work_ms / early_rate
    if now_workers > 0 and work_ms <= 0:
        return 0.0
    rate = max(0.0, now_workers + later_workers - rho)
    if rate <= 0:
        return math.inf
    return cold_start_ms + max(0.0, work_ms - early_rate * cold_start_ms) / rate
