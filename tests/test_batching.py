"""The batch decision, with a fake clock: pure, no Redis."""

import pytest

from carpool.batching import Go, Limits, Wait, decide
from carpool.jobs import BinState

LIM = Limits(max_batch=8, max_wait_ms=20)


def state(depth: int, oldest: int | None, bin_name: str = "small") -> BinState:
    return BinState("m", bin_name, depth, oldest)


def test_full_bin_goes_now_even_before_its_deadline() -> None:
    assert decide(1000, [(state(8, 999), LIM)]) == Go("m", "small", 8)


def test_oldest_job_that_waited_max_wait_goes_now() -> None:
    assert decide(1020, [(state(3, 1000), LIM)]) == Go("m", "small", 8)


def test_otherwise_waits_exactly_until_the_oldest_jobs_deadline() -> None:
    assert decide(1005, [(state(3, 1000), LIM)]) == Wait(1020)


def test_empty_bins_wait_for_an_arrival_only() -> None:
    assert decide(1005, [(state(0, None), LIM), (state(0, None, "big"), LIM)]) == Wait(None)


def test_a_full_bin_goes_before_an_older_due_bin() -> None:
    due = (state(1, 900, "a"), LIM)
    full = (state(8, 1000, "b"), LIM)
    assert decide(1000, [due, full]) == Go("m", "b", 8)


def test_among_due_bins_the_earliest_deadline_goes_first() -> None:
    slow = (state(2, 950, "slow"), Limits(8, 40))  # due at 990
    fast = (state(2, 960, "fast"), Limits(8, 20))  # due at 980
    assert decide(1000, [slow, fast]) == Go("m", "fast", 8)


def test_waits_for_the_earliest_deadline_across_bins() -> None:
    a = (state(2, 1000, "a"), Limits(8, 50))
    b = (state(2, 1010, "b"), Limits(8, 20))
    assert decide(1001, [a, b]) == Wait(1030)


@pytest.mark.parametrize("max_batch,max_wait_ms", [(0, 10), (4, -1)])
def test_limits_refuse_nonsense(max_batch: int, max_wait_ms: int) -> None:
    with pytest.raises(ValueError):
        Limits(max_batch, max_wait_ms)
