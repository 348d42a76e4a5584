"""Batch formation: leave now, or wait until when? Pure functions of clock, bins, limits, costs.

The rules (docs/scheduling.md explains and measures them):

1. **Leave-by.** A bin's batch must leave by its oldest job's admission plus
   ``max_wait_ms`` — or earlier, when its most urgent deadline minus the
   expected service time of the batch it will be (``planned_batch``, with a
   margin) comes first: waiting never makes a job
   miss its deadline. Nor does the claim: it takes no more jobs than still
   finish by that deadline (``batch_that_fits``).
2. **Full.** A bin holding ``max_batch`` jobs is ready at once.
3. **Adaptive** (``Limits.adaptive``): a bin that is not full is ready at once
   unless waiting for more jobs pays (``worth_waiting_for``); it then waits for
   the batch it wants, never past its leave-by time. Fixed windows (adaptive
   off) wait until the leave-by time.
4. **Across bins**, full bins go before the rest, each group earliest leave-by
   first, so a backlog is served oldest first, as admission predicts. A due bin
   goes next, before them all, once it was passed over ``max_bypass`` times for a
   bin due later (overtaken), or ``max_bypass`` times and for ``max_bypass`` longest
   batches: so under any load on other bins a due bin waits a bounded time.

Times are Redis's clock, in ms. This module imports neither torch, Celery nor Redis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from carpool.core.jobs import BinState

#: The expected service time counts this much more toward a deadline: fits are means.
SERVICE_ALLOWANCE = 1.25
#: A peek and a claim between the decision and the batch's start (measured: ~0.2 ms
#: each on a busy 2-core machine, docs/benchmarks.md).
LOOP_ALLOWANCE_MS = 2
#: Passes of a due bin for bins due after it before it goes (rule 4); for older jobs,
#: this many of the longest batches.
MAX_BYPASS = 4


@dataclass(frozen=True)
class Limits:
    """A bin's batching limits, as the worker holds them now (they can be retuned)."""

    max_batch: int
    max_wait_ms: int
    #: Leave early when waiting does not pay (rule 3); off: a fixed window.
    adaptive: bool = False
    #: Serve this bin not at all (an operator's pause; its jobs wait or expire).
    paused: bool = False

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")


@dataclass(frozen=True)
class Cost:
    """A batch of n is expected to take ``a_ms + b_ms·n`` (claim to results written)."""

    a_ms: float
    b_ms: float

    def ms(self, n: int) -> float:
        return self.a_ms + self.b_ms * n


@dataclass(frozen=True)
class BinView:
    """Everything the decision knows of one bin."""

    state: BinState
    limits: Limits
    cost: Cost | None = None  # None: not measured yet
    arrivals_per_ms: float = 0.0
    #: How many decisions in a row passed this bin over while it was due.
    bypassed: int = 0
    #: How many of those chose a bin due later than this one (out of leave-by order).
    overtaken: int = 0
    #: How long ago the first of those passes was, ms.
    passed_over_ms: int = 0


@dataclass(frozen=True)
class Go:
    """Claim up to ``max_n`` jobs of this bin now; ``passed_over``: due bins that wait;
    ``overtaken``: those of them due before the chosen bin."""

    model: str
    bin: str
    max_n: int
    passed_over: tuple[tuple[str, str], ...] = ()
    overtaken: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Wait:
    """Nothing is due; look again at ``until_ms`` (Redis time: a bin falls due or is
    expected to be full) or on a wake token. None: only on a wake token."""

    until_ms: int | None


def deadline_ms(state: BinState, limits: Limits) -> int | None:
    """When this bin's batch must leave by its window alone (rule 1 without deadlines)."""
    if state.oldest_admit_ms is None or state.depth == 0:
        return None
    return state.oldest_admit_ms + limits.max_wait_ms


def planned_batch(now_ms: int, view: BinView) -> int:
    """The batch the deadline rule plans for: the jobs waiting, plus those expected
    to arrive before the most urgent deadline, up to max_batch."""
    waiting = min(view.state.depth, view.limits.max_batch)
    earliest = view.state.earliest_deadline_ms
    if earliest is None:
        return waiting
    expected = math.ceil(view.arrivals_per_ms * max(0, earliest - now_ms))
    return min(view.limits.max_batch, waiting + expected)


def leave_by_ms(view: BinView, now_ms: int) -> int | None:
    """The latest moment this bin's batch may leave (rule 1); None for an empty bin."""
    by = deadline_ms(view.state, view.limits)
    earliest = view.state.earliest_deadline_ms
    if by is None or earliest is None:
        return by
    n = planned_batch(now_ms, view)
    service_ms = view.cost.ms(n) * SERVICE_ALLOWANCE if view.cost is not None else 0.0
    return min(by, earliest - math.ceil(service_ms) - LOOP_ALLOWANCE_MS)


def batch_that_fits(now_ms: int, view: BinView) -> int:
    """The most jobs to claim now: max_batch, unless so many would finish after the
    most urgent job's deadline. A head that is late even alone is not saved at the
    cost of a smaller batch: the batch is a full one, and the claim expires the jobs it
    could not finish in time (claim.lua, by ``Scheduler.cost_of``)."""
    limit = view.limits.max_batch
    earliest, cost = view.state.earliest_deadline_ms, view.cost
    if earliest is None or cost is None or cost.b_ms <= 0:
        return limit
    budget_ms = (earliest - now_ms - LOOP_ALLOWANCE_MS) / SERVICE_ALLOWANCE - cost.a_ms
    fits = math.floor(budget_ms / cost.b_ms)
    return limit if fits < 1 else min(limit, fits)


def worth_waiting_for(cost: Cost | None, arrivals_per_ms: float, max_batch: int) -> float:
    """The batch size below which waiting for one more job pays (rule 3).

    With n jobs waiting and the next expected in g = 1/λ: waiting delays the n by
    g, and each by b more in the bigger batch; the newcomer is spared the rest of
    this batch (a + b·n − g) and a batch of its own. Net, waiting pays while
    (n + 1)·g + n·b < a, i.e. n < (λa − 1) / (1 + λb). Light load (λa < 1) never
    waits; a cost without a fixed part (a = 0) never waits.
    """
    if cost is None or arrivals_per_ms <= 0:
        return 0.0
    lam = arrivals_per_ms
    return min(float(max_batch), (lam * cost.a_ms - 1.0) / (1.0 + lam * cost.b_ms))


def adaptive_wait_ms(view: BinView) -> int:
    """How long the bin should wait for the batch worth having: 0 to leave now."""
    n = min(view.state.depth, view.limits.max_batch)
    target = worth_waiting_for(view.cost, view.arrivals_per_ms, view.limits.max_batch)
    if n >= target:
        return 0
    return math.ceil((math.ceil(target) - n) / view.arrivals_per_ms)


def expected_full_ms(now_ms: int, view: BinView) -> int | None:
    """When the bin should hold max_batch jobs at its arrival rate. admit.lua wakes
    workers when a bin reaches the catalogue's max_batch; a retuned or SLO-capped
    one is smaller, so a waiting worker also looks again at this time."""
    missing = view.limits.max_batch - view.state.depth
    if missing <= 0 or view.arrivals_per_ms <= 0:
        return None
    return now_ms + max(1, math.ceil(missing / view.arrivals_per_ms))


def ready_at_ms(now_ms: int, view: BinView) -> int | None:
    """When this bin's batch should leave (rules 1–3); None: empty or paused."""
    by = leave_by_ms(view, now_ms)
    if by is None or view.limits.paused:
        return None
    if view.state.depth >= view.limits.max_batch:
        return now_ms
    if not view.limits.adaptive:
        return by
    return min(by, now_ms + adaptive_wait_ms(view))


def forced_after_ms(ready: Sequence[BinView], max_bypass: int) -> float:
    """How long a due bin may be passed over in leave-by order before it is forced:
    ``max_bypass`` of the longest batches expected among the ready bins (0 while no
    cost is known, so the count of passes alone decides)."""
    longest = max((v.cost.ms(v.limits.max_batch) for v in ready if v.cost is not None),
                  default=0.0)
    return max_bypass * longest


def _is_forced(view: BinView, max_bypass: int, after_ms: float, ready: int) -> bool:
    """Rule 4's guarantee. Passes in leave-by order serve older jobs first and count
    toward it by time (or, should a fitted cost be far off, by ``max_bypass`` passes
    per ready bin), so a backlog is not broken into turns of one batch per bin: a busy
    bin of short jobs would wait longer than admission predicted."""
    if view.overtaken >= max_bypass or view.bypassed >= max_bypass * ready:
        return True
    return view.bypassed >= max_bypass and view.passed_over_ms >= after_ms


def _order(now_ms: int, view: BinView, forced: bool) -> tuple[int, int, int]:
    """Sort key among ready bins (rule 4): forced bins, full bins, then the rest;
    within each, the earliest leave-by."""
    by = leave_by_ms(view, now_ms)
    assert by is not None  # a ready bin has jobs
    if forced:
        return (0, -view.bypassed, by)
    if view.state.depth >= view.limits.max_batch:
        return (1, 0, by)
    return (2, 0, by)


def _is_due(now_ms: int, view: BinView) -> bool:
    by = leave_by_ms(view, now_ms)
    return by is not None and by <= now_ms


def _as_view(item: BinView | tuple[BinState, Limits]) -> BinView:
    return item if isinstance(item, BinView) else BinView(item[0], item[1])


def decide(
    now_ms: int, bins: Sequence[BinView | tuple[BinState, Limits]], max_bypass: int = MAX_BYPASS
) -> Go | Wait:
    """Pick the bin to serve now, or say until when nothing is due."""
    views = [_as_view(b) for b in bins]
    ready: list[BinView] = []
    soonest: int | None = None
    for view in views:
        at = ready_at_ms(now_ms, view)
        if at is None:
            continue
        if at <= now_ms:
            ready.append(view)
            continue
        full = expected_full_ms(now_ms, view)
        wake = at if full is None else min(at, full)
        if soonest is None or wake < soonest:
            soonest = wake
    if not ready:
        return Wait(soonest)
    after_ms = forced_after_ms(ready, max_bypass)
    chosen = min(ready, key=lambda v: _order(  # first of equals: stable
        now_ms, v, _is_forced(v, max_bypass, after_ms, len(ready))))
    chosen_by = leave_by_ms(chosen, now_ms)
    assert chosen_by is not None
    passed = [v for v in ready if v is not chosen and _is_due(now_ms, v)]
    overtaken = tuple(_key(v) for v in passed if _by(v, now_ms) < chosen_by)
    return Go(chosen.state.model, chosen.state.bin, batch_that_fits(now_ms, chosen),
              tuple(_key(v) for v in passed), overtaken)


def _key(view: BinView) -> tuple[str, str]:
    return (view.state.model, view.state.bin)


def _by(view: BinView, now_ms: int) -> int:
    by = leave_by_ms(view, now_ms)
    assert by is not None  # a due bin has jobs
    return by
