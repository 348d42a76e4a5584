"""The job record's shared helpers (carpool/core/jobs.py): the times it writes."""

from __future__ import annotations

import pytest

from carpool.core.jobs import rfc3339


@pytest.mark.parametrize(("ms", "written"), [
    (1_767_258_000_123, "2026-01-01T09:00:00.123Z"),
    (0, "1970-01-01T00:00:00.000Z"),
    # Years below 1000 with four digits, as RFC 3339 has them (strftime's %Y wrote "1").
    (-62_135_596_800_000, "0001-01-01T00:00:00.000Z"),
    (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
])
def test_rfc3339_writes_a_four_digit_year_and_milliseconds_in_utc(ms: int, written: str) -> None:
    assert rfc3339(ms) == written
