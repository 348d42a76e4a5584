"""``Prefer: wait=N`` (web/results/prefer.py): what is accepted, capped, ignored and refused."""

from __future__ import annotations

import pytest

from carpool.core.errors import InvalidInput
from web.results.prefer import applied, preferred_wait_s


@pytest.mark.parametrize(("header", "wait_s"), [
    (None, None), ("", None), ("respond-async", None), ("return=minimal", None),
    ("wait=10", 10.0), ("WAIT=3", 3.0), ("respond-async, wait=5", 5.0),
    ("wait=5; foo=bar", 5.0), ('wait="7"', 7.0), ("wait=0", 0.0),
    ("wait=4, wait=9", 4.0),  # RFC 7240: the first counts
    ("wait=600", 60.0), ("wait=" + "9" * 40, 60.0),  # capped at the server's maximum
])
def test_a_wait_preference_is_read_capped_or_ignored(header: str | None,
                                                      wait_s: float | None) -> None:
    assert preferred_wait_s(header, 60.0) == wait_s


@pytest.mark.parametrize("header", ["wait=abc", "wait=-1", "wait", "wait=1.5", "wait=",
                                    "wait=１", "wait=1," + "x" * 2000])
def test_a_malformed_wait_preference_is_refused_naming_the_header(header: str) -> None:
    with pytest.raises(InvalidInput, match="Prefer"):
        preferred_wait_s(header, 60.0)


def test_the_applied_header_says_whole_seconds() -> None:
    assert applied(30.0) == {"Preference-Applied": "wait=30"}
