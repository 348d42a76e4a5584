"""The scaling rule (carpool/scheduling/need.py) on hand-computed cases."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from carpool.backend.replies import ADMITTED_END_SHARE
from carpool.scheduling import need as need_module
from carpool.scheduling.batching import Cost
from carpool.scheduling.need import BinLoad, ModelLoad, workers_needed

#: The synthetic model of the issue: a batch of n takes 300 + 5·n ms.
SYNTH = Cost(300.0, 5.0)


def load(depth: int = 0, per_ms: float = 0.0, *, cost: Cost | None = SYNTH,
         slack_ms: float | None = None, budget_ms: float = 10_000, cold_ms: float = 30_000,
         up: int = 0, busy: int = 0, loading: int = 0) -> ModelLoad:
    return ModelLoad([BinLoad(depth, 64, cost, per_ms)], slack_ms, budget_ms, cold_ms,
                     up, busy, loading)


def test_nothing_queued_nothing_arriving_needs_none() -> None:
    need = workers_needed(load(up=3))
    assert (need.workers, need.misses_projected, need.why) == (0, 0, "idle")


def test_a_trickle_of_arrivals_below_a_job_a_minute_keeps_no_worker() -> None:
    # A decayed rate never reaches 0: below a job a minute it counts as none.
    assert workers_needed(load(per_ms=1 / 120_000, up=1)).workers == 0
    assert workers_needed(load(per_ms=1 / 30_000, up=1)).workers == 1


def test_never_below_the_workers_holding_leases_or_loading() -> None:
    assert workers_needed(load(up=3, busy=2, loading=1)).workers == 3
    # A small need still keeps every busy worker: a scale-down never takes one mid-batch.
    need = workers_needed(load(depth=1, slack_ms=9_000, up=4, busy=4))
    assert (need.workers, need.why) == (4, "floor")


def test_a_queued_job_and_no_worker_needs_one_even_without_a_cost() -> None:
    need = workers_needed(load(depth=1, cost=None, slack_ms=5_000))
    assert need.workers == 1
    # Nothing measured and no time bound either: no division anywhere.
    assert workers_needed(load(depth=1, cost=None, budget_ms=0, cold_ms=0)).workers == 1


def test_scale_from_zero_projects_the_jobs_the_cold_start_makes_late() -> None:
    # W = 1·300 + 10·5 = 350 ms; H = 10 s ≤ cold start 30 s, so H = 30 + 10 = 40 s and
    # 350 / (40 000 − 30 000) rounds up to 1. Every job is due in 10 s: all late.
    need = workers_needed(load(depth=10, slack_ms=10_000))
    assert (need.workers, need.misses_projected) == (1, 10)


def test_the_arrival_load_sets_the_steady_pool() -> None:
    # 200 jobs/s at a full batch of 64: 620 ms / 64 = 9.6875 ms a job, ρ = 1.9375
    # workers; at 85 % busy, ceil(2.279) = 3.
    need = workers_needed(load(per_ms=0.2, up=3))
    assert (need.workers, need.why) == (3, "arrivals")


def test_the_deadlines_set_the_pool_for_a_backlog() -> None:
    # 6 400 jobs = 100 batches: W = 100·300 + 6 400·5 = 62 000 ms. H = max(5 s, 10 s);
    # the one worker up does 10 000, each new one 10 000 − 2 000: 52 000 / 8 000 = 6.5,
    # so 7 more: 8. (7 would do 58 000 < 62 000.)
    need = workers_needed(load(depth=6_400, slack_ms=5_000, cold_ms=2_000, up=1))
    assert (need.workers, need.why) == (8, "deadlines")
    # Projected with the one worker up: the i-th of 200 steps ends at 310·i ms, due at
    # 5 000 + 5 000·(i − 1)/199: late from i = 18 on, 183 steps of 32 jobs.
    assert need.misses_projected == 5_856


def test_a_backlog_needs_at_most_one_worker_per_queued_batch() -> None:
    # W = 2·300 + 128·5 = 1 240 ms due in 0.5 s, cold start 0.4 s: (1 240 − 500) / 100
    # asks for 8 more; only 2 batches exist to run beside the one worker up.
    need = workers_needed(load(depth=128, slack_ms=500, budget_ms=500, cold_ms=400, up=1))
    assert need.workers == 3


def test_slack_shorter_than_the_cold_start_sizes_past_it() -> None:
    # W = 620 ms, due in 1 s; no worker started now is up within 30 s, so the one up
    # does it all: 1 worker, none late.
    need = workers_needed(load(depth=64, slack_ms=1_000, budget_ms=5_000, up=1))
    assert (need.workers, need.misses_projected) == (1, 0)


def test_no_time_bound_needs_one_worker_for_a_backlog() -> None:
    need = workers_needed(load(depth=6_400, budget_ms=0))
    assert (need.workers, need.misses_projected) == (1, 0)


@given(depth=st.integers(0, 100_000), per_s=st.floats(0, 5_000),
       slack_ms=st.one_of(st.none(), st.floats(-10_000, 100_000)),
       budget_ms=st.floats(0, 100_000), cold_ms=st.floats(0, 300_000),
       up=st.integers(0, 20), busy=st.integers(0, 20), loading=st.integers(0, 20),
       known=st.booleans())
def test_any_input_gives_a_count_at_or_above_the_floor(
        depth: int, per_s: float, slack_ms: float | None, budget_ms: float, cold_ms: float,
        up: int, busy: int, loading: int, known: bool) -> None:
    busy = min(busy, up)
    need = workers_needed(load(depth, per_s / 1000, cost=SYNTH if known else None,
                               slack_ms=slack_ms, budget_ms=budget_ms, cold_ms=cold_ms,
                               up=up, busy=busy, loading=loading))
    assert need.workers >= busy + loading
    assert 0 <= need.misses_projected <= depth
    if depth or per_s >= 1 / 60:
        assert need.workers >= 1


def test_a_queue_at_the_admission_bound_doubles_the_pool() -> None:
    # 4 workers up, W = 28 batches = 28·300 + 1 792·5 = 17 360 ms ≥ 0.6 · 6 000 · 4: the
    # queue sits where admission refuses, which hides the surge: double.
    need = workers_needed(load(depth=1_792, slack_ms=6_000, budget_ms=6_000, up=4, busy=4))
    assert (need.workers, need.why) == (8, "saturated")
    # Workers already starting: wait for them rather than double again.
    need = workers_needed(load(depth=1_792, slack_ms=6_000, budget_ms=6_000, up=4, busy=4,
                               loading=2))
    assert need.workers == 6


def test_a_queue_held_at_admissions_share_of_the_budget_reads_as_saturated() -> None:
    # Admission keeps the predicted end within 0.7 of a deadline (admit.lua's
    # DEADLINE_SHARE), so a surge holds the queue just under it. W = 24·300 + 1 536·5
    # = 14 880 ms, 0.62 of 4 × 6 000: below admission's share, at or above SATURATED.
    need = workers_needed(load(depth=1_536, slack_ms=6_000, budget_ms=6_000, up=4, busy=4))
    assert (need.workers, need.why) == (8, "saturated")


def test_saturated_lies_under_admissions_deadline_share() -> None:
    # Else a queue admission holds at its bound never reads as saturated. The share is
    # admit.lua's (tests/redis/test_admission_model_pace.py pins the two alike).
    assert need_module.SATURATED < ADMITTED_END_SHARE


def test_refusals_count_as_arrivals() -> None:
    # 100 jobs/s admitted and 100 refused: ρ = 0.2 · 9.6875 = 1.9375 → 3 at 85 %.
    bins = [BinLoad(0, 64, SYNTH, 0.1, refused_per_ms=0.1)]
    assert workers_needed(ModelLoad(bins, None, 10_000, 30_000, up=1)).workers == 3


def test_a_vanishing_budget_with_no_cold_start_still_gives_a_finite_count() -> None:
    # Found by the property test: H = 1e-308 ms and no cold start divided W by ~0.
    need = workers_needed(load(depth=1, budget_ms=1e-308, cold_ms=0))
    assert need.workers == 1
