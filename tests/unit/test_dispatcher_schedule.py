"""The retry schedule: exponential backoff with jitter, capped; Retry-After honoured."""

from __future__ import annotations

import email.utils

import pytest

from dispatcher.schedule import (
    JITTER_FLOOR,
    MAX_RETRY_AFTER_S,
    backoff_s,
    next_wait_s,
    parse_retry_after,
)


def test_backoff_doubles_from_the_base_and_stops_at_the_cap() -> None:
    top = [backoff_s(n, 5.0, 3600.0, rand=lambda: 0.999999) for n in range(1, 15)]
    assert top[:4] == pytest.approx([5.0, 10.0, 20.0, 40.0], rel=1e-5)
    assert max(top) == pytest.approx(3600.0, rel=1e-5)
    assert backoff_s(10_000, 5.0, 3600.0) <= 3600.0  # no overflow


def test_jitter_spreads_each_wait_over_its_upper_half() -> None:
    assert backoff_s(3, 1.0, 60.0, rand=lambda: 0.0) == pytest.approx(4.0 * JITTER_FLOOR)
    waits = {round(backoff_s(3, 1.0, 60.0), 6) for _ in range(50)}
    assert len(waits) > 10 and all(2.0 <= w < 4.0 for w in waits)


def test_a_longer_retry_after_wins_but_never_beyond_the_cap() -> None:
    assert next_wait_s(1, 1.0, 60.0, 30.0, rand=lambda: 0.0) == 30.0
    assert next_wait_s(1, 1.0, 60.0, 10_000.0, rand=lambda: 0.0) == 60.0
    assert next_wait_s(1, 1.0, 60.0, 0.1, rand=lambda: 0.0) == 0.5


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(email.utils.formatdate(now + 90, usegmt=True), now) == 90.0
    assert parse_retry_after(email.utils.formatdate(now - 90, usegmt=True), now) == 0.0
    assert parse_retry_after("9" * 30, now) is None
    assert parse_retry_after("99999999", now) == MAX_RETRY_AFTER_S


@pytest.mark.parametrize("bad", [None, "", "soon", "-5", "1.5", "Mon, 99 Foo", "\x00"])
def test_an_unreadable_retry_after_is_ignored(bad: str | None) -> None:
    assert parse_retry_after(bad, 0.0) is None
