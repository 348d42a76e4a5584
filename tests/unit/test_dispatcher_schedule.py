"""The retry schedule: exponential backoff with jitter, capped; Retry-After honoured."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    assert parse_retry_after(" 120\t", now) == 120.0  # optional whitespace around it


#: Digits to str.isdigit, not to RFC 9110: a superscript (a receiver's byte 0xB2, read as
#: latin-1), Arabic-Indic, fullwidth; and a date's digits out of range.
NOT_ASCII_DIGITS = ["\u00b2", "\u00b9\u00b2", "\u0661\u0662\u0660", "\uff11\uff12",
                    "12\u00a0", "Mon, 01 Jan 99999 00:00:00 GMT",
                    "Mon, 01 Jan 2024 00:00:00 +9999", "Mon, 01 Jan 2024 00:00:00 G\u00b2T"]


@pytest.mark.parametrize("bad", [None, "", "soon", "-5", "1.5", "Mon, 99 Foo", "\x00",
                                 *NOT_ASCII_DIGITS])
def test_an_unreadable_retry_after_is_ignored(bad: str | None) -> None:
    assert parse_retry_after(bad, 0.0) is None


@given(st.text(max_size=40) | st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
def test_no_retry_after_makes_the_parse_raise(value: str) -> None:
    wait_s = parse_retry_after(value, 1_800_000_000.0)
    assert wait_s is None or 0.0 <= wait_s <= MAX_RETRY_AFTER_S
