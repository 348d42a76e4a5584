"""Decayed-count rates, and Retry-After from a bin's depth and drain rate."""

import pytest

from carpool.admission.retry_after import (
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    drain_rate_per_s,
    retry_after_s,
)
from carpool.scheduling.rates import RateMeter, decayed_rate_per_ms


def test_a_steady_counter_reads_as_its_rate() -> None:
    meter = RateMeter(tau_ms=1000, min_age_ms=100)
    meter.update(0, 500)  # a baseline: history before the first read is not counted
    for t in range(10, 5001, 10):
        meter.update(t, 500 + t // 10 * 2)  # 2 per 10 ms
    assert meter.per_ms(5000) == pytest.approx(0.2, rel=0.02)


def test_the_rate_is_unbiased_early_and_decays_when_events_stop() -> None:
    meter = RateMeter(tau_ms=1000, min_age_ms=100)
    meter.update(0, 0)
    for t in range(10, 301, 10):
        meter.update(t, t // 10)
    assert meter.per_ms(300) == pytest.approx(0.1, rel=0.05)
    assert meter.per_ms(3300) < 0.1 * 0.06  # three time constants of silence


def test_a_counter_reset_starts_a_new_baseline() -> None:
    meter = RateMeter(tau_ms=1000, min_age_ms=100)
    meter.update(0, 100)
    meter.update(10, 5)
    assert meter.per_ms(10) == 0.0


def test_one_early_event_does_not_read_as_a_huge_rate() -> None:
    assert decayed_rate_per_ms(1.0, 1.0, 1000, 1000) == pytest.approx(1 / 632.1, rel=0.01)


def test_retry_after_is_depth_over_drain_rate_within_bounds() -> None:
    assert retry_after_s(100, 10.0) == 10.0
    assert retry_after_s(200, 10.0) == 20.0  # grows with depth
    assert retry_after_s(1, 1000.0) == RETRY_AFTER_MIN_S
    assert retry_after_s(10**9, 1.0) == RETRY_AFTER_MAX_S
    assert retry_after_s(5, 0.0) == RETRY_AFTER_MAX_S  # nothing drains: as long as allowed


def test_a_bin_that_never_drained_has_no_rate() -> None:
    assert drain_rate_per_s(0.0, -1) == 0.0
