"""The one bounded wait for a condition that offers no event to block on.

A process just started (redis-server, gunicorn, a Celery worker) tells nobody
when it is ready: the only way is to ask it again and again, with a bound. Code
that can block on something (a Redis BLPOP, a pub/sub message, a threading
Event) does that instead; this is for what cannot.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: How often a condition is asked again: a start-up takes tenths of a second to
#: seconds, so 50 ms costs little CPU and adds at most 50 ms to the wait.
POLL_S = 0.05


def wait_until(ready: Callable[[], bool], timeout_s: float, what: str, *,
               check: Callable[[], None] | None = None,
               pause: Callable[[float], object] = time.sleep,
               poll_s: float = POLL_S) -> None:
    """Return once ``ready()`` is true; raise TimeoutError naming ``what`` after
    ``timeout_s``. ``check`` runs between tries and raises to give up early (the
    process being waited for has died); ``pause`` waits between tries (an Event's
    ``wait``, so that what sets it ends the pause at once)."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        pause(poll_s)
