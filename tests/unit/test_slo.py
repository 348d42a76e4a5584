"""The p99 target's AIMD cap on max_batch."""

from carpool.scheduling.batching import Cost
from carpool.scheduling.slo import WINDOW_JOBS, BatchCap, keep_up_batch, p99


def window(latency_ms: float) -> list[float]:
    return [latency_ms] * WINDOW_JOBS  # one batch of WINDOW_JOBS jobs: never "full" below


def test_p99_is_the_nearest_rank() -> None:
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([5.0]) == 5.0


def small_batches(latency_ms: float, size: int = 4) -> list[list[float]]:
    return [[latency_ms] * size for _ in range(WINDOW_JOBS // size)]


def test_a_missed_target_shrinks_the_cap_multiplicatively_and_a_met_one_grows_it_by_one() -> None:
    cap = BatchCap()
    for batch in small_batches(300):
        cap.observe(batch, target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 24 and cap.limit(32) == 24
    for batch in small_batches(300):
        cap.observe(batch, target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 18
    for batch in small_batches(50):
        cap.observe(batch, target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 19


def test_a_miss_while_batches_leave_jobs_behind_is_a_backlog_and_lifts_the_cap() -> None:
    cap = BatchCap()
    for batch in small_batches(300):
        cap.observe(batch, target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 24
    for batch in small_batches(300, size=25):
        cap.observe(batch, target_ms=100, ceiling=32, floor=1, left_behind=True)
    assert cap.cap == 32


def test_a_miss_while_batches_waited_for_a_busy_worker_leaves_the_cap_alone() -> None:
    cap = BatchCap()
    for batch in small_batches(300):
        cap.observe(batch, target_ms=100, ceiling=32, floor=1, held=False)
    assert cap.cap == 32


def test_no_verdict_before_a_full_window() -> None:
    cap = BatchCap()
    cap.observe([999.0] * (WINDOW_JOBS - 1), target_ms=100, ceiling=32, floor=1)
    assert cap.cap is None and cap.limit(32) == 32


def test_the_cap_never_drops_below_the_batch_that_keeps_up_nor_rises_above_max_batch() -> None:
    cap = BatchCap()
    for _ in range(20):
        for batch in small_batches(300, size=2):
            cap.observe(batch, target_ms=100, ceiling=32, floor=10)
    assert cap.cap == 10
    for _ in range(40):
        cap.observe(window(1), target_ms=100, ceiling=32, floor=10)
    assert cap.cap == 32


def test_no_target_means_no_cap() -> None:
    cap = BatchCap()
    for batch in small_batches(300):
        cap.observe(batch, target_ms=100, ceiling=32, floor=1)
    assert cap.cap == 24
    cap.observe([300.0], target_ms=0, ceiling=32, floor=1)
    assert cap.cap is None and cap.limit(32) == 32


def test_the_batch_that_keeps_up_is_lambda_a_over_1_minus_lambda_b() -> None:
    cost = Cost(20.0, 1.0)
    assert keep_up_batch(cost, 0.25, 32) == 10  # 1.5 × 0.25·20 / (1 − 0.25)
    assert keep_up_batch(cost, 0.0, 32) == 1
    assert keep_up_batch(cost, 2.0, 32) == 32  # beyond any batch size: never shrink
    assert keep_up_batch(None, 0.5, 32) == 1
