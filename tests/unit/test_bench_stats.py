"""The bench's arithmetic on a recorded set of results: percentiles, summary, knee."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from carpool.bench.records import JobRecord, Outcome, read_records
from carpool.bench.stats import (
    KneeRule,
    Latency,
    Summary,
    batch_histogram,
    find_knee,
    percentile,
    server_rate,
    steady_rate,
    summarize,
)

RECORDED = Path(__file__).parent / "data" / "bench_records.jsonl"


@pytest.fixture
def records() -> list[JobRecord]:
    return read_records(RECORDED)


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 25) == pytest.approx(1.75)
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan_and_out_of_range_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_p99_of_a_hundred_values_sits_between_the_top_two() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 99) == pytest.approx(99.01)
    assert Latency.of(values).max == 100.0
    assert Latency.of(values).mean == pytest.approx(50.5)


def test_summary_counts_every_outcome_and_hides_none(records: list[JobRecord]) -> None:
    s = summarize("recorded", records, duration_s=0.5)
    assert s.counts == {"ok": 6, "rejected": 1, "error": 0, "failed": 1, "misrouted": 1,
                        "lost": 1, "timeout": 0}
    assert s.jobs == 10
    assert s.offered_rate == pytest.approx(20.0)
    # 6 ok jobs came back within 0.44 s, less than the 0.5 s schedule.
    assert s.achieved_rate == pytest.approx(6 / 0.5)
    stretched = [replace(r, t_final=r.t_final + 1.0) if r.seq == 8 and r.t_final else r
                 for r in records]
    # Above capacity results keep coming after the schedule: 0.05 s to 1.49 s.
    assert summarize("late", stretched, 0.5).achieved_rate == pytest.approx(6 / 1.44)


def test_latency_is_measured_from_the_scheduled_time(records: list[JobRecord]) -> None:
    s = summarize("recorded", records, duration_s=0.5)
    ok_e2e = sorted([50.0, 40.0, 80.0, 70.0, 65.0, 90.0])
    assert s.e2e_ms.p50 == pytest.approx(percentile(ok_e2e, 50))
    assert s.e2e_ms.max == pytest.approx(90.0)
    late = records[6]
    assert late.lateness_ms == pytest.approx(30.0)


def test_split_is_the_mean_of_ok_results_timings(records: list[JobRecord]) -> None:
    s = summarize("recorded", records, duration_s=0.5)
    assert s.split_ms["queue"] == pytest.approx((20 + 10 + 20 + 10 + 5 + 40) / 6)
    assert s.split_ms["inference"] == pytest.approx((22 + 22 + 24 + 24 + 24 + 21) / 6)


def test_batch_histogram_counts_batches_not_jobs(records: list[JobRecord]) -> None:
    # Jobs report their batch's size: two jobs of size 2, four of 4, two of 1.
    assert batch_histogram(records) == {1: 2, 2: 1, 4: 1}
    s = summarize("recorded", records, duration_s=0.5)
    assert s.mean_batch == pytest.approx(8 / 4)


def test_server_rates_use_redis_clock(records: list[JobRecord]) -> None:
    # ok jobs: admitted from 1000 ms, the last done at 1462 ms.
    assert server_rate(records) == pytest.approx(6 / 0.462)
    # The first batch (2 jobs done at 1043) opens the window; 4 more done by 1462.
    assert steady_rate(records) == pytest.approx(4 / 0.419)


def test_a_backlog_has_no_offered_rate(records: list[JobRecord]) -> None:
    s = summarize("drain", records, duration_s=None)
    assert s.offered_rate is None
    assert s.delivered == 1.0


def _point(offered: float, achieved: float, p99: float) -> Summary:
    base = summarize("p", [JobRecord(0, 16, 0.0, 0.0, Outcome.OK, t_final=0.01)], 1.0)
    return replace(base, label=f"{offered:g}", offered_rate=offered, achieved_rate=achieved,
                   e2e_ms=Latency(p99 / 2, p99 * 0.9, p99, p99, p99 / 2))


def test_knee_is_the_last_healthy_rate_before_the_curve_bends() -> None:
    sweep = [_point(100, 100, 40), _point(200, 199, 45), _point(300, 297, 70),
             _point(400, 390, 95), _point(500, 430, 400), _point(600, 440, 60)]
    knee = find_knee(list(reversed(sweep)), KneeRule(k=2.0, min_delivered=0.95))
    assert knee is not None and knee.offered_rate == 300  # 95 ms > 2 × 40 ms at 400/s


def test_knee_stops_where_throughput_falls_behind_even_if_latency_is_fine() -> None:
    sweep = [_point(100, 100, 40), _point(200, 180, 41), _point(300, 290, 42)]
    knee = find_knee(sweep, KneeRule(k=2.0, min_delivered=0.95))
    assert knee is not None and knee.offered_rate == 100


def test_no_knee_when_nothing_was_swept() -> None:
    assert find_knee([]) is None


def test_no_knee_when_even_the_lowest_rate_falls_behind() -> None:
    assert find_knee([_point(100, 50, 40), _point(200, 60, 41)]) is None
