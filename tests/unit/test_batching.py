"""The batch decision, with a fake clock: pure, no Redis. One test per rule."""

import math

import pytest

from carpool.core.jobs import BinState
from carpool.scheduling.batching import (
    LOOP_ALLOWANCE_MS,
    MAX_BYPASS,
    SERVICE_ALLOWANCE,
    BinView,
    Cost,
    Go,
    Limits,
    Wait,
    adaptive_wait_ms,
    decide,
    leave_by_ms,
    worth_waiting_for,
)

LIM = Limits(max_batch=8, max_wait_ms=20)
ADAPT = Limits(max_batch=8, max_wait_ms=20, adaptive=True)
COST = Cost(a_ms=20.0, b_ms=1.0)


def state(depth: int, oldest: int | None, bin_name: str = "small",
          deadline: int | None = None) -> BinState:
    return BinState("m", bin_name, depth, oldest, deadline)


# Rule 1 and 2: the window, and a full bin.

def test_full_bin_goes_now_even_before_its_deadline() -> None:
    assert decide(1000, [(state(8, 999), LIM)]) == Go("m", "small", 8)


def test_oldest_job_that_waited_max_wait_goes_now() -> None:
    assert decide(1020, [(state(3, 1000), LIM)]) == Go("m", "small", 8)


def test_otherwise_waits_exactly_until_the_oldest_jobs_deadline() -> None:
    assert decide(1005, [(state(3, 1000), LIM)]) == Wait(1020)


def test_empty_bins_wait_for_an_arrival_only() -> None:
    assert decide(1005, [(state(0, None), LIM), (state(0, None, "big"), LIM)]) == Wait(None)


def test_a_paused_bin_never_goes_even_when_full() -> None:
    paused = Limits(8, 20, paused=True)
    assert decide(5000, [(state(8, 1000), paused)]) == Wait(None)


# Rule 1: a job's deadline, allowing for the service time.

def test_a_deadline_before_the_window_moves_the_leave_by_time_earlier() -> None:
    view = BinView(state(2, 1000, deadline=1015), LIM)
    assert leave_by_ms(view, 1000) == 1015 - LOOP_ALLOWANCE_MS


def test_the_leave_by_time_allows_for_the_expected_service_of_the_batch() -> None:
    view = BinView(state(4, 1000, deadline=1100), Limits(8, 500), cost=COST)
    service = math.ceil(COST.ms(4) * SERVICE_ALLOWANCE)  # 30 ms for a batch of 4
    by = 1100 - service - LOOP_ALLOWANCE_MS
    assert leave_by_ms(view, 1000) == by
    assert decide(1000, [view]) == Wait(by)
    assert decide(by, [view]) == Go("m", "small", 4)  # 4 more would end after the deadline


def test_the_allowance_plans_for_the_jobs_expected_before_the_deadline() -> None:
    view = BinView(state(2, 1000, deadline=1100), Limits(8, 500), cost=COST,
                   arrivals_per_ms=0.02)  # two more expected in the 100 ms left
    assert leave_by_ms(view, 1000) == 1100 - math.ceil(COST.ms(4) * SERVICE_ALLOWANCE) - 2


def test_a_claim_takes_no_more_jobs_than_finish_by_the_most_urgent_deadline() -> None:
    view = BinView(state(20, 1000, deadline=1050), Limits(32, 20), cost=COST)
    fits = math.floor((50 - LOOP_ALLOWANCE_MS) / SERVICE_ALLOWANCE - COST.a_ms)  # b = 1 ms
    assert decide(1000, [view]) == Go("m", "small", fits)
    doomed = BinView(state(20, 1000, deadline=1010), Limits(32, 20), cost=COST)
    assert decide(1000, [doomed]) == Go("m", "small", 32)  # late even alone: a full batch


def test_a_deadline_after_the_window_changes_nothing() -> None:
    assert leave_by_ms(BinView(state(2, 1000, deadline=9000), LIM, cost=COST), 1000) == 1020


def test_a_job_already_past_its_deadline_makes_its_bin_go_at_once() -> None:
    assert decide(1000, [(state(1, 999, deadline=990), LIM)]) == Go("m", "small", 8)


# Rule 3: adaptive batching.

def test_waiting_pays_only_while_n_is_below_lambda_a_minus_1_over_1_plus_lambda_b() -> None:
    lam = 0.5  # jobs per ms
    assert worth_waiting_for(COST, lam, 32) == pytest.approx((lam * 20 - 1) / (1 + lam * 1))
    assert worth_waiting_for(COST, 0.04, 32) < 0  # λa < 1: light load never waits
    assert worth_waiting_for(Cost(0.0, 1.0), 5.0, 32) < 0  # no fixed cost: never waits
    assert worth_waiting_for(None, 5.0, 32) == 0.0  # not measured yet: never waits
    assert worth_waiting_for(COST, 100.0, 8) == 8.0  # capped at max_batch


def test_adaptive_under_light_load_leaves_at_once_instead_of_waiting_out_the_window() -> None:
    light = BinView(state(1, 1000), ADAPT, cost=COST, arrivals_per_ms=0.01)
    assert decide(1000, [light]) == Go("m", "small", 8)
    fixed = BinView(state(1, 1000), LIM, cost=COST, arrivals_per_ms=0.01)
    assert decide(1000, [fixed]) == Wait(1020)


def test_adaptive_under_heavy_load_waits_for_the_batch_worth_having() -> None:
    lam = 0.5  # target (10 − 1) / 1.5 = 6 jobs
    view = BinView(state(2, 1000), ADAPT, cost=COST, arrivals_per_ms=lam)
    assert adaptive_wait_ms(view) == math.ceil((6 - 2) / lam)
    assert decide(1000, [view]) == Wait(1008)
    grown = BinView(state(6, 1000), ADAPT, cost=COST, arrivals_per_ms=lam)
    assert decide(1008, [grown]) == Go("m", "small", 8)


def test_adaptive_never_waits_past_the_window_or_a_deadline() -> None:
    busy = BinView(state(2, 1000), ADAPT, cost=COST, arrivals_per_ms=0.2)  # wants 3/1.2
    assert adaptive_wait_ms(busy) == 5
    late = BinView(state(2, 990), ADAPT, cost=COST, arrivals_per_ms=0.2)
    assert decide(1000, [late]) == Wait(1005)
    wide = Limits(8, 500, adaptive=True)
    nearly = BinView(state(2, 1000, deadline=1035), wide, cost=COST, arrivals_per_ms=0.5)
    by = leave_by_ms(nearly, 1000)  # plans for 2 + 0.5·35 more jobs: a batch of 8
    assert by == 1035 - math.ceil(COST.ms(8) * SERVICE_ALLOWANCE) - LOOP_ALLOWANCE_MS == 998
    assert decide(1000, [nearly]) == Go("m", "small", 6)  # waiting would pay, but not in time


# Rule 4: across bins.

def test_a_full_bin_goes_before_a_due_bin_that_was_not_passed_over_yet() -> None:
    due = (state(1, 900, "a"), LIM)
    full = (state(8, 1000, "b"), LIM)
    assert decide(1000, [due, full]) == Go("m", "b", 8, passed_over=(("m", "a"),),
                                           overtaken=(("m", "a"),))


def test_a_due_bin_passed_over_max_bypass_times_goes_before_any_full_bin() -> None:
    due = BinView(state(1, 900, "a"), LIM, bypassed=MAX_BYPASS)
    full = BinView(state(8, 1000, "b"), LIM)
    assert decide(1000, [due, full]) == Go("m", "a", 8)


def test_among_forced_bins_the_most_passed_over_goes_first() -> None:
    a = BinView(state(1, 900, "a"), LIM, bypassed=MAX_BYPASS)
    b = BinView(state(1, 950, "b"), LIM, bypassed=MAX_BYPASS + 1)
    assert decide(1000, [a, b]).bin == "b"  # type: ignore[union-attr]


def test_passes_in_leave_by_order_force_a_bin_only_after_max_bypass_longest_batches() -> None:
    # A backlog: both bins full and due, b's oldest job younger than a's. Serving a
    # first is oldest-first, as admission predicts: it forces b by time, not by count.
    longest_ms = COST.ms(LIM.max_batch)
    older = BinView(state(8, 900, "a"), LIM, COST)
    waited = MAX_BYPASS * longest_ms

    def younger(passed_over_ms: float) -> BinView:
        return BinView(state(8, 950, "b"), LIM, COST, bypassed=MAX_BYPASS,
                       passed_over_ms=math.ceil(passed_over_ms))
    assert decide(1000, [older, younger(waited - 1)]) == Go(
        "m", "a", 8, passed_over=(("m", "b"),))  # passed over, not overtaken
    assert decide(1000, [older, younger(waited)]).bin == "b"  # type: ignore[union-attr]


def test_a_bin_overtaken_max_bypass_times_by_bins_due_later_is_forced() -> None:
    due = BinView(state(1, 900, "a"), LIM, COST, bypassed=MAX_BYPASS - 1,
                  overtaken=MAX_BYPASS - 1, passed_over_ms=1)
    full = BinView(state(8, 1000, "b"), LIM, COST)
    assert decide(1000, [due, full]) == Go("m", "b", 8, passed_over=(("m", "a"),),
                                           overtaken=(("m", "a"),))
    forced = BinView(state(1, 900, "a"), LIM, COST, bypassed=MAX_BYPASS,
                     overtaken=MAX_BYPASS, passed_over_ms=1)
    assert decide(1000, [forced, full]).bin == "a"  # type: ignore[union-attr]


def test_among_due_bins_the_earliest_deadline_goes_first() -> None:
    slow = (state(2, 950, "slow"), Limits(8, 40))  # due at 990
    fast = (state(2, 960, "fast"), Limits(8, 20))  # due at 980
    assert decide(1000, [slow, fast]) == Go("m", "fast", 8, passed_over=(("m", "slow"),))


def test_among_full_bins_the_earliest_deadline_goes_first() -> None:
    a = (state(8, 990, "a"), LIM)
    b = (state(8, 950, "b"), LIM)
    assert decide(1000, [a, b]) == Go("m", "b", 8)  # a is full but not due: not passed over


def test_waits_for_the_earliest_deadline_across_bins() -> None:
    a = (state(2, 1000, "a"), Limits(8, 50))
    b = (state(2, 1010, "b"), Limits(8, 20))
    assert decide(1001, [a, b]) == Wait(1030)


@pytest.mark.parametrize("max_batch,max_wait_ms", [(0, 10), (4, -1)])
def test_limits_refuse_nonsense(max_batch: int, max_wait_ms: int) -> None:
    with pytest.raises(ValueError):
        Limits(max_batch, max_wait_ms)
