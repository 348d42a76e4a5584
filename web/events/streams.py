"""A job's events as server-sent events (``text/event-stream``; docs/events.md).

One stream follows one job (``GET /result/<id>/events``) or several (``GET
/events?ids=``). Each event is a job's state change, its data the job document as
``GET /result`` shows it; a queued job's event repeats when its place in its bin
changes, at most once a second. The stream ends once every job it follows is final,
or after ``lifetime_s`` (the client reconnects with ``Last-Event-ID``).

**Event ids.** carpool keeps no history of events: a job's state is its history.
Each state has a *version* that grows along any job's life: queued with ``a`` runs
behind it is ``2a``, its next run ``2a + 1`` (attempts ``a + 1``), and its end
``2a + 1`` with the runs it had (so done after run ``a + 1`` is ``2a + 3``). An
event's id is the version of every job the stream follows, one base-36 character
each, in the order of ``ids``: ``y`` for any final state, a state before it its
version modulo 34 (``0``-``x``), ``z`` a job not told of yet. So a final state is told
once whatever the attempts (a job handed back with its attempt counted may run past
``max_attempts``), and never taken for one the client saw: a refunded run makes a
cancel's version equal to the run's. On reconnect the
stream sends each job's state unless the id says the client saw that very version,
and a queued job's place again (it may have moved); once every job is final and
seen, it answers 204, which tells an ``EventSource`` to stop reconnecting.

**Cost.** A stream waits on the process's pub/sub listener (web/results/waiters.py,
web/results/followers.py), as a long-poll does: a claim or an end wakes it, and what a
claim notice says is enough for ``running`` without a read. While a job is queued
it is read once a second, on the second (so concurrent streams' reads share round
trips: web/results/reads.py), for its place; a running one every ``RUNNING_RECHECK_S``, in
case its worker died and it went back to its bin.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from carpool.core.errors import BackendUnavailable, InvalidInput
from carpool.core.jobs import JobStatus, JobView
from web.results.followers import Claimed, Follow, with_claim
from web.results.polls import CLIENT_CHECK_S, ClientGone

#: Most jobs one ``GET /events`` follows: a longer list is refused (400).
MAX_STREAM_IDS = 100
#: A queued job's place is read (and reported, when it moved) at most this often.
POSITION_EVERY_S = 1.0
#: A running job is read this often, in case it went back to its bin (a dead worker).
RUNNING_RECHECK_S = 5.0
#: A comment line this often keeps proxies from cutting a quiet stream.
KEEPALIVE_S = 15.0
#: The reconnect delay a stream asks of its client (``retry:``), in ms.
RETRY_MS = 1000
#: A timer may wake this much early or late: a read or a place due "once a second"
#: counts as due this much before the second is over.
SLACK_S = 0.05
#: One character per job in an event id: a state before the final one, its version
#: modulo 34 ("0"-"x": wrapping, not saturating, so that two states in a row always
#: differ); any final state "y"; "z" a job the client has not been told of yet.
VERSION_CHARS = "0123456789abcdefghijklmnopqrstuvwxy"
FINAL = VERSION_CHARS[-1]
UNSEEN = "z"
#: How many characters the states before the final one wrap around.
_OPEN_CHARS = len(VERSION_CHARS) - 1

#: Reads jobs by id, in order; None where a job is gone.
Reader = Callable[[list[str]], Sequence[JobView | None]]


def version(view: JobView) -> int:
    """The job's state as a number that grows along its life (the module says how)."""
    runs = view.attempts or 0
    if view.status is JobStatus.QUEUED:
        return 2 * runs
    if view.status is JobStatus.RUNNING:
        return 2 * runs - 1
    return 2 * runs + 1


def version_char(view: JobView) -> str:
    if view.status.is_final:
        return FINAL
    return VERSION_CHARS[version(view) % _OPEN_CHARS]


def parse_last_event_id(raw: str | None, jobs: int) -> list[str | None]:
    """Each job's version as the client last saw it (None: nothing seen). Raises
    ``InvalidInput`` when the header is not an id this stream could have sent."""
    if raw is None or raw == "":
        return [None] * jobs
    if len(raw) != jobs or not all(c in VERSION_CHARS or c == UNSEEN for c in raw):
        raise InvalidInput(
            f"Last-Event-ID {raw[:40]!r} is not an id of this stream: it has one character "
            f"in [0-9a-z] per job followed ({jobs}); reconnect without it to start over")
    return [None if c == UNSEEN else c for c in raw]


def running_from_claim(view: JobView, claimed: Claimed | None) -> JobView | None:
    """A queued job's view as running, when ``claimed`` is the claim of its next run."""
    if (view.status is JobStatus.QUEUED and claimed is not None
            and claimed.attempts == (view.attempts or 0) + 1):
        return replace(view, status=JobStatus.RUNNING, attempts=claimed.attempts,
                       started_ms=claimed.t_claim_ms, position=None)
    return None


def sse(event_id: str, event: str, data: object) -> str:
    """One event as the text/event-stream format writes it (data is one JSON line)."""
    return f"id: {event_id}\nevent: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@dataclass
class _Job:
    view: JobView
    #: The version the client has seen (None: none), and the place it was last told.
    seen: str | None
    told_position: int | None = None
    told_at: float = -math.inf
    read_at: float = 0.0
    gone: bool = False

    @property
    def open(self) -> bool:
        return not self.gone and not self.view.status.is_final


class JobStream:
    """The events of the jobs in ``views`` (read after ``follow`` was registered), as
    the client that saw ``seen`` (``parse_last_event_id``) should get them. A job in
    ``ended`` is gone (its result deleted or expired since the client saw it): nothing
    more is told of it, as of one that goes mid-stream, and its place in the id stays."""

    def __init__(self, views: Sequence[JobView], seen: Sequence[str | None], follow: Follow,
                 read: Reader, claim_of: Callable[[str], Claimed | None],
                 gone: ClientGone | None, lifetime_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 ended: frozenset[str] = frozenset()) -> None:
        now = clock()
        self.jobs = [_Job(view, s, read_at=now, gone=view.id in ended)
                     for view, s in zip(views, seen, strict=True)]
        self.follow = follow
        self.read = read
        self.claim_of = claim_of
        self.gone = gone
        self.clock = clock
        self.end_at = now + lifetime_s

    def has_news(self) -> bool:
        """False when every job is final and the client saw it so: nothing to send."""
        return any(job.open or not job.gone and job.seen != version_char(job.view)
                   for job in self.jobs)

    def events(self) -> Iterator[str]:
        now = self.clock()
        # One write for the start: each chunk costs the web a send.
        yield "".join([f"retry: {RETRY_MS}\n\n",
                       *(e for job in self.jobs if not job.gone
                         for e in self._tell(job, job.view, now))])
        try:
            yield from self._follow()
        except BackendUnavailable as exc:  # the status line is sent: say it, and end
            yield sse(self._cursor(), "error", {"error": {
                "code": "backend_unavailable", "message": f"{exc}; reconnect to resume"}})

    def _follow(self) -> Iterator[str]:
        keepalive_at = self.clock() + KEEPALIVE_S
        while any(job.open for job in self.jobs):
            now = self.clock()
            if now >= self.end_at:
                return
            queued = any(j.open and j.view.status is JobStatus.QUEUED for j in self.jobs)
            # On the second: every stream of this process reads at the same instant.
            tick = math.floor(now) + POSITION_EVERY_S if queued else now + RUNNING_RECHECK_S
            if not self._wait(min(tick, keepalive_at, self.end_at)):
                return  # the client has gone
            now = self.clock()
            # What is ready now goes in one write: each chunk costs the web a send.
            ready: list[str] = []
            if now >= keepalive_at:
                ready.append(": keep-alive\n\n")
                keepalive_at = now + KEEPALIVE_S
            try:
                for event in self._step(self.follow.take(), now):
                    ready.append(event)
            except BackendUnavailable:
                if ready:  # told (the cursor counts them): sent before the error
                    yield "".join(ready)
                raise
            if ready:
                yield "".join(ready)

    def _step(self, woken: set[str], now: float) -> Iterator[str]:
        due: list[_Job] = []
        for job in self.jobs:
            if not job.open:
                continue
            if job.view.id in woken:
                running = running_from_claim(job.view, self.claim_of(job.view.id))
                if running is not None:  # the claim notice says it all: no read
                    yield from self._tell(job, running, now)
                    continue
                due.append(job)
            elif (job.view.status is JobStatus.QUEUED
                  and now - job.read_at >= POSITION_EVERY_S - SLACK_S
                  or now - job.read_at >= RUNNING_RECHECK_S - SLACK_S):
                due.append(job)
        if not due:
            return
        views = self.read([job.view.id for job in due])
        for job, view in zip(due, views, strict=True):
            job.read_at = now
            if view is None:  # deleted (or expired) meanwhile: nothing more to tell
                job.gone = True
                continue
            yield from self._tell(job, with_claim(view, self.claim_of(view.id)), now)

    def _tell(self, job: _Job, view: JobView, now: float) -> Iterator[str]:
        """The event for ``view`` when the client has not seen it; a queued job's place
        at most once a second."""
        char = version_char(view)
        moved = view.status is JobStatus.QUEUED and view.position != job.told_position
        if char == job.seen and not moved:
            job.view = view
            return
        if char == job.seen and now - job.told_at < POSITION_EVERY_S - SLACK_S:
            return  # a new place, told at the next read (the view is kept as it was)
        job.view, job.seen, job.told_at = view, char, now
        job.told_position = view.position if view.status is JobStatus.QUEUED else None
        yield sse(self._cursor(), view.status.value, view.to_json())

    def _cursor(self) -> str:
        return "".join(job.seen or UNSEEN for job in self.jobs)

    def _wait(self, until: float) -> bool:
        """Wait for a wake-up or ``until``; False as soon as the client has gone."""
        while True:
            remaining = until - self.clock()
            if remaining <= 0:
                return True
            if self.follow.event.wait(min(remaining, CLIENT_CHECK_S)):
                return True
            if self.gone is not None and self.gone():
                return False
