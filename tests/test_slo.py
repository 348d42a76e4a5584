"""The p99 target's AIMD cap on max_batch."""

from carpool.batching import Cost
from carpool.slo import WINDOW_JOBS, BatchCap, keep_up_batch, p99


def window(latency_ms: float) -> list[float]:
    return [latency_ms] * WINDOW_JOBS


def test_p99_is_the_nearest_rank() -> None:
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([5.0]) == 5.0


def test_a_missed_target_shrinks_the_cap_multiplicatively_and_a_met_one_grows_it_by_one() -> None:
    cap = BatchCap()
    cap.observe(window(300), target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 24 and cap.limit(32) == 24
    cap.observe(window(300), target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 18
    cap.observe(window(50), target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 19


def test_no_verdict_before_a_full_window() -> None:
    cap = BatchCap()
    cap.observe([999.0] * (WINDOW_JOBS - 1), target_ms=100, ceiling=32, floor=1)
    assert cap.cap is None and cap.limit(32) == 32


def test_the_cap_never_drops_below_the_batch_that_keeps_up_nor_rises_above_max_batch() -> None:
    cap = BatchCap()
    for _ in range(20):
        cap.observe(window(300), target_ms=100, ceiling=32, floor=10)
    assert cap.cap == 10
    for _ in range(40):
        cap.observe(window(1), target_ms=100, ceiling=32, floor=10)
    assert cap.cap == 32


def test_no_target_means_no_cap() -> None:
    cap = BatchCap()
    cap.observe(window(300), target_ms=100, ceiling=32, floor=1)
    cap.observe(window(300), target_ms=0, ceiling=32, floor=1)
    assert cap.cap is None and cap.limit(32) == 32


def test_the_batch_that_keeps_up_is_lambda_a_over_1_minus_lambda_b() -> None:
    cost = Cost(20.0, 1.0)
    assert keep_up_batch(cost, 0.5, 32) == 20  # 0.5·20 / (1 − 0.5)
    assert keep_up_batch(cost, 0.0, 32) == 1
    assert keep_up_batch(cost, 2.0, 32) == 32  # beyond any batch size: never shrink
    assert keep_up_batch(None, 0.5, 32) == 1
