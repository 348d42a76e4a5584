"""Long-polls: ``GET /result/<id>?wait=S`` returns the moment its job ends.

Workers PUBLISH each finished job's id on the done channel (complete.lua,
cancel.lua, claim.lua for expired jobs). One listener per process subscribes
to it and sets the events of the polls waiting on that id, so a waiting poll
costs an event and a parked greenlet (gunicorn's gevent worker), not a thread
or a Redis connection.

A poll registers its event *before* it reads the job, so a completion between
the read and the wait still wakes it. The notification is only a hint: a poll
always re-reads the job, and a lost message (a reconnect, the listener still
starting) costs at most the wait, never a wrong answer — on every
(re)subscription the listener wakes all polls to re-read.

The first read is skipped when the process can prove the job has not ended:
admit.lua PUBLISHes the ids it queued on the admitted channel, and the listener
subscribes to all its channels on one connection. Redis delivers one connection's
messages in publish order, and a job's admission and end are both published by
its shard's node, so its admission notice comes before its end notice. The ids
seen admitted and not yet ended are *pending*. A poll whose id is pending when
it registers waits first and reads once woken (or at its deadline): an end
processed after its registration sets its event; one processed before took the
id out of pending. Every (re)subscription and every lost connection clears
pending (notices may have been missed), and it holds at most ``PENDING_CAP``
ids, the oldest evicted first; an id not in it is unknown and read first, as
before. An id left there by a job whose end notice never comes (its record
deleted by hand or evicted) costs a poll its wait, then the read answers.

The same connection hears the results channel: the final views of the jobs each
batch wrote (carpool/backend/pushed.py). The listener keeps them a short while
(web/results/pushed_views.py), so that re-read, and the first read of a poll for a job
that already ended, is answered from memory. Whenever the subscription breaks
they are dropped, as a message may have been lost.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import redis
from redis.client import PubSub

from carpool.backend.connection import next_message, open_pubsub, redis_errors
from carpool.backend.pushed import parse
from carpool.backend.queue import ended_ids
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import JobView
from web.results.followers import Claimed, Follow, Followers
from web.results.polls import CLIENT_CHECK_S, ClientGone
from web.results.pushed_views import MAX_AGE_S, PushedViews

log = logging.getLogger(__name__)

#: How long closing waits for the listener to end.
CLOSE_WAIT_S = 0.5
#: Reconnect backoff after Redis is lost: doubles from the first to the last.
BACKOFF_FIRST_S = 0.1
BACKOFF_LAST_S = 5.0
#: Most ids kept as pending (seen admitted, not yet ended); the oldest go first. One
#: costs ~120 bytes, and it needs to cover only the jobs queued or running at once.
PENDING_CAP = 100_000


class _Listener:
    """This process's subscriber thread, the events it sets and the pending ids."""

    def __init__(self, client: redis.Redis, done_channel: str, admitted_channel: str,
                 results_channel: str, views: PushedViews, claimed_channel: str = "") -> None:
        self.client = client
        self.done_channel = done_channel
        self.admitted_channel = admitted_channel
        self.results_channel = results_channel
        self.claimed_channel = claimed_channel
        self.channels = (done_channel, admitted_channel, results_channel,
                         *([claimed_channel] if claimed_channel else []))
        self.views = views
        #: The event streams' wake-ups, and the claims heard (web/results/followers.py).
        self.followers = Followers()
        self.waiters: dict[str, set[threading.Event]] = {}
        #: Ids seen admitted and not seen ended since the subscription, oldest first.
        self.pending: dict[str, None] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.backoff_s = BACKOFF_FIRST_S
        #: Set once every channel is heard (tests wait on it), cleared when the
        #: connection goes.
        self.subscribed = threading.Event()
        #: The subscription being read, for ``interrupt``.
        self._pubsub: PubSub | None = None
        self.thread = threading.Thread(target=self.run, name="carpool-notifier", daemon=True)

    def add(self, job_id: str, event: threading.Event) -> bool:
        """Registers ``event``; True when ``job_id`` is pending (so it has not ended)."""
        with self.lock:
            self.waiters.setdefault(job_id, set()).add(event)
            return job_id in self.pending

    def remove(self, job_id: str, event: threading.Event) -> None:
        with self.lock:
            events = self.waiters.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self.waiters[job_id]

    def admitted(self, job_ids: list[str]) -> None:
        with self.lock:
            for job_id in job_ids:
                self.pending[job_id] = None
            excess = len(self.pending) - PENDING_CAP
            if excess > 0:  # unknown again: read first, as if never seen
                for job_id in list(itertools.islice(self.pending, excess)):
                    del self.pending[job_id]

    def ended(self, job_ids: list[str]) -> None:
        with self.lock:
            for job_id in job_ids:
                self.pending.pop(job_id, None)
                for event in self.waiters.get(job_id, ()):
                    event.set()
        self.followers.ended(job_ids)

    def pushed(self, message: str) -> None:
        """Keep the views a batch pushed, then wake their polls; forget deleted ids."""
        try:
            got = parse(message)
        except (ValueError, KeyError, TypeError) as exc:  # never the listener's end
            log.warning("ignored a malformed results message (%s): %.80r", exc, message)
            return
        self.views.discard(got.deleted)
        if got.jobs:
            self.views.put(got.jobs, len(message) // len(got.jobs))
            self.ended([job.id for job in got.jobs])

    def wake_all(self) -> None:
        """Notices may have been missed: nothing is known pending; every poll re-reads."""
        with self.lock:
            self.pending.clear()
            for events in self.waiters.values():
                for event in events:
                    event.set()
        self.followers.wake_all()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.listen()
            except BackendUnavailable as exc:
                if self.stopping.is_set():
                    break  # interrupted by close: its connection was shut under the read
                log.warning("done-channel listener lost Redis (%s); reconnecting in %.1f s",
                            exc, self.backoff_s)
            except Exception:
                if self.stopping.is_set():
                    break
                # A dead listener would make every poll sit out its full wait: keep going.
                log.exception("done-channel listener failed; restarting in %.1f s", self.backoff_s)
            self.views.clear()  # what was published meanwhile is lost: forget what
            self.wake_all()  # may have changed since, and let every poll re-read
            if self.stopping.wait(self.backoff_s):
                break
            self.backoff_s = min(self.backoff_s * 2, BACKOFF_LAST_S)

    def listen(self) -> None:
        """Subscribe and dispatch until stopped; raises when Redis is lost."""
        pubsub = self._pubsub = open_pubsub(self.client)
        try:
            with redis_errors():
                # One command, one connection: its messages arrive in publish order.
                pubsub.subscribe(*self.channels)
                while not self.stopping.is_set():
                    # Blocks (a message a job at low load: the cheapest read there is);
                    # ``interrupt`` ends the wait. Should it land between the check above
                    # and this read, redis-py reconnects and resubscribes, and the
                    # subscribe confirmations (not ignored: open_pubsub's default) come
                    # back as messages, so the loop still sees ``stopping``.
                    message = next_message(pubsub)
                    if message is None:
                        continue
                    if message["type"] == "message":
                        channel, data = message["channel"], str(message["data"])
                        if channel == self.results_channel:
                            self.pushed(data)
                        elif channel == self.admitted_channel:
                            self.admitted(ended_ids(data))
                        elif channel == self.claimed_channel:
                            self.followers.claimed(data)
                        else:
                            self.ended(ended_ids(data))
                    elif message["type"] == "subscribe":
                        self.confirmed(int(message["data"]))
        finally:
            self.subscribed.clear()
            pubsub.close()

    def interrupt(self) -> None:
        """End a read blocked on the channel (``stopping`` set first): shut its
        connection under it, so the read returns at once and ``run`` sees ``stopping``."""
        pubsub = self._pubsub
        connection = None if pubsub is None else pubsub.connection
        if connection is not None:
            connection.disconnect()

    def confirmed(self, channels: int) -> None:
        """One subscribe confirmation: ``channels`` this connection now hears. A new
        connection's come first, one per channel, before any message: at the first,
        what was published before it was missed; after the last, the listener hears
        everything."""
        if channels == 1:
            self.backoff_s = BACKOFF_FIRST_S
            self.views.clear()
            self.wake_all()
        if channels == len(self.channels):
            self.subscribed.set()


class Notifier:
    """Wakes long-polls when their job ends; one listener per process, started on first use.

    Built with the app, possibly before gunicorn forks; the listener thread and
    its connection do not survive a fork, so each process starts its own
    (tracked by pid) the first time a poll waits in it.
    """

    def __init__(self, client: redis.Redis, done_channel: str, admitted_channel: str,
                 results_channel: str, views_max_age_s: float = MAX_AGE_S,
                 claimed_channel: str = "") -> None:
        self._client = client
        self._channels = (done_channel, admitted_channel, results_channel)
        self._claimed_channel = claimed_channel
        self._views_max_age_s = views_max_age_s
        self._start_lock = threading.Lock()
        self._pid = 0
        self._listener: _Listener | None = None

    @contextmanager
    def watch(self, job_id: str) -> Iterator[threading.Event]:
        """An event that is set when ``job_id`` may have ended; register before reading."""
        with self.watch_pending(job_id) as (event, _):
            yield event

    @contextmanager
    def watch_pending(self, job_id: str) -> Iterator[tuple[threading.Event, bool]]:
        """``watch``'s event, and whether ``job_id`` was pending when it was registered:
        then it had not ended, and its end will set the event (no need to read first)."""
        listener = self._current()
        event = threading.Event()
        pending = listener.add(job_id, event)
        try:
            yield event, pending
        finally:
            listener.remove(job_id, event)

    @contextmanager
    def follow(self, job_ids: list[str]) -> Iterator[Follow]:
        """One wake-up for an event stream of ``job_ids``: woken, naming the job, when one
        is claimed or ends, and for all of them when notices may have been missed."""
        followers = self._current().followers
        follow = Follow()
        for job_id in job_ids:
            followers.add(job_id, follow)
        try:
            yield follow
        finally:
            for job_id in job_ids:
                followers.remove(job_id, follow)

    def claim_of(self, job_id: str) -> Claimed | None:
        """The claim this process heard for ``job_id`` since its last end notice."""
        listener = self._running()
        return listener.followers.claim_of(job_id) if listener is not None else None

    def forget(self, job_id: str) -> None:
        """Drop a pushed view at once in this process (its job was just deleted here);
        the others drop it when the deletion's message reaches them."""
        listener = self._running()
        if listener is not None:
            listener.views.discard([job_id])

    def pushed_view(self, job_id: str) -> JobView | None:
        """The job's final view if this process was pushed it (starting the listener on
        first use, so later completions are heard)."""
        return self._current().views.get(job_id)

    def listening(self) -> bool:
        """True once this process's listener hears every channel (starting it if need be)."""
        return self._current().subscribed.is_set()

    def pending(self) -> int:
        """How many ids this process knows as pending now (tests, debugging)."""
        listener = self._running()
        if listener is None:
            return 0
        with listener.lock:
            return len(listener.pending)

    def watching(self, job_id: str) -> int:
        """How many polls in this process wait on ``job_id`` now."""
        listener = self._running()
        if listener is None:
            return 0
        with listener.lock:
            return len(listener.waiters.get(job_id, ()))

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Stop this process's listener (and wake its polls); a later poll starts a new one."""
        with self._start_lock:
            listener, self._listener, self._pid = self._listener, None, 0
        if listener is not None:
            listener.stopping.set()
            listener.interrupt()
            listener.wake_all()
            if listener.thread.is_alive():
                listener.thread.join(timeout_s)

    def _running(self) -> _Listener | None:
        """This process's listener if one runs (never one inherited through a fork)."""
        listener = self._listener
        return listener if listener is not None and self._pid == os.getpid() else None

    def _current(self) -> _Listener:
        pid = os.getpid()
        with self._start_lock:
            listener = self._listener
            if listener is not None and self._pid == pid:
                return listener
            # First poll in this process, or the first since a fork: the parent's
            # thread did not come along (only the forking thread does).
            listener = _Listener(self._client, *self._channels,
                                 PushedViews(self._views_max_age_s), self._claimed_channel)
            self._listener, self._pid = listener, pid
        # Outside the lock: under gevent, starting a thread switches greenlets.
        # Polls that register before it subscribes are woken by its first subscribe.
        listener.thread.start()
        return listener


class JobReader(Protocol):
    """Reads one job: ``Queue``, or ``web.results.reads.ReadBatcher`` sharing round trips."""

    def get(self, job_id: str) -> JobView | None: ...


def wait_for_final(queue: JobReader, notifier: Notifier, job_id: str, wait_s: float,
                   gone: ClientGone | None = None) -> JobView | None:
    """The job once it is final, or as it is after ``wait_s``; None when it does not exist.

    Returns early, with the job as it is, once ``gone()`` says the client has left.
    A job this process saw admitted and not ended is not read until woken (or the
    deadline): one Redis round trip fewer.
    """
    if wait_s <= 0:
        return queue.get(job_id)
    deadline = time.monotonic() + wait_s
    with notifier.watch_pending(job_id) as (woken, pending):
        if pending:
            _wait(woken, deadline, gone)  # then read, whatever woke it: never None unread
        return _until_final(queue, woken, job_id, deadline, True, gone)


def await_final_after(queue: JobReader, woken: threading.Event, job_id: str,
                      deadline: float, gone: ClientGone | None = None) -> JobView | None:
    """Like ``wait_for_final`` for a job whose ``woken`` was registered before it was
    admitted (``POST /submit?wait=``): it is queued, so wait first and read once woken,
    one Redis round trip fewer than reading first."""
    return _until_final(queue, woken, job_id, deadline, False, gone)


def _until_final(queue: JobReader, woken: threading.Event, job_id: str, deadline: float,
                 read_first: bool, gone: ClientGone | None) -> JobView | None:
    if not read_first and not _wait(woken, deadline, gone):
        return None  # not woken: still queued or running, as far as this poll knows
    while True:
        woken.clear()  # before the read: a wake-up during the read is kept
        view = queue.get(job_id)
        if view is None or view.status.is_final or time.monotonic() >= deadline:
            return view
        if not _wait(woken, deadline, gone):
            return view


def _wait(woken: threading.Event, deadline: float, gone: ClientGone | None) -> bool:
    """Wait until woken: True; False at the deadline, or as soon as the client is gone."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return woken.is_set()
        if woken.wait(remaining if gone is None else min(remaining, CLIENT_CHECK_S)):
            return True
        if gone is not None and gone():
            return False
