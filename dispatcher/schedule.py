"""When a failed delivery is tried again: exponential backoff with jitter, a receiver's
Retry-After honoured, and an age past which an event is dead-lettered."""

from __future__ import annotations

import email.utils
import random
import re
from collections.abc import Callable

#: Jitter keeps this share of each wait at least: a fleet of events that failed
#: together (a receiver's outage) comes back spread over the other half.
JITTER_FLOOR = 0.5
#: A Retry-After longer than this is not believed: the receiver's outage ends in hours.
MAX_RETRY_AFTER_S = 86_400.0
#: Retry-After's delay-seconds: ASCII digits only (str.isdigit also takes '²', which
#: float() refuses); more than 9 is a receiver's nonsense.
_DELAY_SECONDS = re.compile(r"[0-9]{1,9}")


def backoff_s(attempts: int, base_s: float, max_s: float,
              rand: Callable[[], float] = random.random) -> float:
    """The wait after ``attempts`` failed tries (>= 1): base * 2^(attempts-1), capped at
    ``max_s``, times a jitter in [JITTER_FLOOR, 1)."""
    ideal = min(max_s, base_s * 2.0 ** min(attempts - 1, 64))
    return ideal * (JITTER_FLOOR + (1 - JITTER_FLOOR) * rand())


def next_wait_s(attempts: int, base_s: float, max_s: float, retry_after_s: float | None,
                rand: Callable[[], float] = random.random) -> float:
    """The wait before the next try: the backoff, or longer when the receiver asked for
    longer (Retry-After), never beyond ``max_s``."""
    wait = backoff_s(attempts, base_s, max_s, rand)
    if retry_after_s is not None:
        wait = max(wait, min(retry_after_s, max_s))
    return wait


def parse_retry_after(value: str | None, now_s: float) -> float | None:
    """Retry-After (RFC 9110: seconds, or an HTTP date) as seconds from ``now_s``; None
    when absent or unreadable. Never raises: the value is the receiver's, any bytes."""
    value = (value or "").strip(" \t")
    if _DELAY_SECONDS.fullmatch(value):
        return min(float(value), MAX_RETRY_AFTER_S)
    if not value or not value.isascii():
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            return None
        return min(max(0.0, when.timestamp() - now_s), MAX_RETRY_AFTER_S)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
