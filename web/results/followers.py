"""Event streams' wake-ups: which jobs each stream follows, and the claims this process heard.

A long-poll waits for its job's end; an event stream (web/events/streams.py) also reports
when the job starts running. claim.lua writes no record, so it PUBLISHes each
claim's jobs on the claimed channel instead: ``<now_ms> <id> <attempts> ...``, one
message per claim. The notifier's listener (web/results/waiters.py) hears it on the
connection it hears the done channel on, so a job's claim notice comes before its end
notice. Here it wakes the streams that follow those jobs (never the long-polls: a
claim would only make them read a job that is still not final), and keeps each
claim's time and attempt count, so a stream reports ``running`` and a document shows
``started_at`` without a Redis read. Kept until the job's end notice, at most
``CLAIMS_CAP`` of them (the oldest go first); forgotten when the subscription
breaks, since notices may have been missed meanwhile.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from carpool.core.jobs import JobStatus, JobView

log = logging.getLogger(__name__)

#: Most claims kept (the jobs running now need one each); ~150 bytes a claim.
CLAIMS_CAP = 100_000


@dataclass(frozen=True)
class Claimed:
    """One job's claim as the claimed channel told it."""

    t_claim_ms: int
    #: The claim's run count, this run included.
    attempts: int


@dataclass(eq=False)
class Follow:
    """One stream's wake-up: which of its jobs may have changed since it last looked."""

    event: threading.Event = field(default_factory=threading.Event)
    dirty: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wake(self, job_id: str) -> None:
        with self.lock:
            self.dirty.add(job_id)
        self.event.set()

    def take(self) -> set[str]:
        """The jobs woken since the last call; clears the event first, so a wake-up
        that comes while the caller reads is kept for its next wait."""
        self.event.clear()
        with self.lock:
            dirty, self.dirty = self.dirty, set()
        return dirty


def parse_claimed(message: str) -> tuple[int, list[tuple[str, int]]]:
    """One claimed-channel message as (claim time, [(id, attempts), ...])."""
    t_ms, *rest = message.split()
    if len(rest) % 2:
        raise ValueError("an id without its attempt count")
    return int(t_ms), [(rest[i], int(rest[i + 1])) for i in range(0, len(rest), 2)]


class Followers:
    """The streams following each job in this process, and the claims heard."""

    def __init__(self) -> None:
        self._follows: dict[str, set[Follow]] = {}
        self._claims: dict[str, Claimed] = {}
        self._lock = threading.Lock()

    def add(self, job_id: str, follow: Follow) -> None:
        with self._lock:
            self._follows.setdefault(job_id, set()).add(follow)

    def remove(self, job_id: str, follow: Follow) -> None:
        with self._lock:
            follows = self._follows.get(job_id)
            if follows is not None:
                follows.discard(follow)
                if not follows:
                    del self._follows[job_id]

    def claim_of(self, job_id: str) -> Claimed | None:
        with self._lock:
            return self._claims.get(job_id)

    def claimed(self, message: str) -> None:
        try:
            t_ms, jobs = parse_claimed(message)
        except ValueError as exc:  # never the listener's end
            log.warning("ignored a malformed claimed message (%s): %.80r", exc, message)
            return
        woken: list[tuple[str, Follow]] = []
        with self._lock:
            for job_id, attempts in jobs:
                self._claims.pop(job_id, None)  # re-inserted last: the newest
                self._claims[job_id] = Claimed(t_ms, attempts)
                woken.extend((job_id, f) for f in self._follows.get(job_id, ()))
            excess = len(self._claims) - CLAIMS_CAP
            if excess > 0:
                for job_id in list(itertools.islice(self._claims, excess)):
                    del self._claims[job_id]
        self._wake(woken)

    def ended(self, job_ids: Iterable[str]) -> None:
        woken: list[tuple[str, Follow]] = []
        with self._lock:
            for job_id in job_ids:
                self._claims.pop(job_id, None)
                woken.extend((job_id, f) for f in self._follows.get(job_id, ()))
        self._wake(woken)

    def wake_all(self) -> None:
        """Notices may have been missed: forget every claim; every stream re-reads."""
        with self._lock:
            self._claims.clear()
            woken = [(job_id, f) for job_id, follows in self._follows.items() for f in follows]
        self._wake(woken)

    @staticmethod
    def _wake(woken: Iterable[tuple[str, Follow]]) -> None:
        for job_id, follow in woken:
            follow.wake(job_id)

    def following(self, job_id: str) -> int:
        """How many streams in this process follow ``job_id`` now (tests)."""
        with self._lock:
            return len(self._follows.get(job_id, ()))


def with_claim(view: JobView, claimed: Claimed | None) -> JobView:
    """A running job's view with its claim's start time, when this process heard the
    claim of the run it is in (its attempt count says so)."""
    if (view.status is JobStatus.RUNNING and claimed is not None
            and claimed.attempts == view.attempts and view.started_ms is None):
        return replace(view, started_ms=claimed.t_claim_ms)
    return view
