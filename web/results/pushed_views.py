"""The final views this web process was pushed (carpool/backend/pushed.py), kept a short while.

A poll for a job that ended a moment ago, the common case for an asynchronous
client, is answered from here without a Redis round trip. What is kept is exact:
a final record changes only when it is deleted (published, so dropped here) or
expires (entries live at most half the shortest result TTL); and the listener
clears everything whenever its subscription breaks, since messages published
meanwhile were lost. Bounded by bytes: the oldest go first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from carpool.backend.pushed import PushedJob
from carpool.core.jobs import JobView

log = logging.getLogger(__name__)

#: How long a pushed view is answered from memory at most (also at most half the
#: shortest result TTL: see ``max_age_for``).
MAX_AGE_S = 30.0
#: Memory for pushed views per web process, in bytes of their JSON.
MAX_BYTES = 64 * 1024 * 1024


def max_age_for(result_ttls_s: Iterable[int]) -> float:
    """Half the shortest result TTL, at most ``MAX_AGE_S``: a view is never answered
    after its record could have expired."""
    return min([MAX_AGE_S, *(ttl / 2 for ttl in result_ttls_s)])


class PushedViews:
    """id -> final view, with an age limit and a byte budget; thread-safe. A pushed job is
    kept as it came, and its view built the first time it is asked for."""

    def __init__(self, max_age_s: float = MAX_AGE_S, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._views: OrderedDict[str, tuple[float, JobView | PushedJob, int]] = OrderedDict()
        self._bytes = 0
        #: Polls answered from memory (tests, and anyone tuning the budget).
        self.hits = 0

    def put(self, views: Iterable[JobView | PushedJob], nbytes_each: int) -> None:
        now = self._clock()
        with self._lock:
            for view in views:
                self._drop(view.id)
                self._views[view.id] = (now, view, nbytes_each)
                self._bytes += nbytes_each
            while self._bytes > self.max_bytes and self._views:
                _, (_, _, n) = self._views.popitem(last=False)
                self._bytes -= n

    def get(self, job_id: str) -> JobView | None:
        with self._lock:
            entry = self._views.get(job_id)
            if entry is None:
                return None
            if self._clock() - entry[0] > self.max_age_s:
                self._drop(job_id)
                return None
        kept = entry[1]
        if isinstance(kept, JobView):
            with self._lock:
                self.hits += 1
            return kept
        try:  # outside the lock: the other polls need not wait for this parse
            view = kept.view()
        except (ValueError, KeyError, TypeError) as exc:  # its poll reads Redis instead
            log.warning("ignored a malformed pushed job (%s): %.80r", exc, kept.line)
            with self._lock:
                if self._views.get(job_id) is entry:
                    self._drop(job_id)
            return None
        with self._lock:
            if self._views.get(job_id) is entry:  # built once: later polls reuse it
                self._views[job_id] = (entry[0], view, entry[2])
            self.hits += 1
        return view

    def discard(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._drop(job_id)

    def clear(self) -> None:
        with self._lock:
            self._views.clear()
            self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._views)

    def _drop(self, job_id: str) -> None:
        entry = self._views.pop(job_id, None)
        if entry is not None:
            self._bytes -= entry[2]
