"""The long-poll notifier on real Redis: wakes by id, survives a lost connection and a fork."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from redis.client import PubSub

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.catalogue import builtin_models
from carpool.core.jobs import JobStatus, JobView, Outcome, new_job_id
from tests.support.procs import wait_until
from web.results import waiters
from web.results.waiters import Notifier, wait_for_final

#: Bound on any one wait here; each normally takes milliseconds.
BOUND_S = 10.0


@pytest.fixture
def listener_name(key_prefix: str) -> str:
    return f"notifier-{key_prefix}"


@pytest.fixture
def notifier(redis_url: str, keys: Keys, listener_name: str) -> Iterator[Notifier]:
    # Named, so the test can find (and kill) exactly this listener's connection.
    own = redis.Redis.from_url(redis_url, decode_responses=True, client_name=listener_name,
                               socket_timeout=5.0)
    n = Notifier(own, keys.done_channel, keys.admitted_channel, keys.results_channel)
    yield n
    n.close()
    own.close()


def listener_ids(client: redis.Redis, name: str) -> list[int]:
    """Redis client ids of our listener's subscribed connections."""
    return [int(c["id"]) for c in client.client_list()
            if c.get("name") == name and int(c.get("sub", 0)) > 0]


def subscribed(notifier: Notifier) -> None:
    """Starts the listener and waits until it hears every channel (its first subscription
    has woken every poll by then). Not by a poll's wake-up: the poll that starts the
    listener may register after that first subscription, when the machine is busy."""
    wait_until(notifier.listening, BOUND_S, "every channel heard")


class CountingReader:
    """A real Queue's ``get``, counted."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.reads = 0

    def get(self, job_id: str) -> JobView | None:
        view = self.queue.get(job_id)
        self.reads += 1  # once read: a test that waits for a read sees what it returned
        return view


@dataclass(frozen=True)
class MissedNotices(Keys):
    """The same keys, but ends are published where no listener of the test hears them."""

    @property
    def done_channel(self) -> str:
        return f"{{{self.prefix}}}:elsewhere"


def test_the_first_subscription_wakes_the_polls_registered_before_it(
    notifier: Notifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll that registers while the listener is still subscribing is woken, to read,
    by the first subscription: what ended before it was never heard."""
    registered = threading.Event()
    real_open = waiters.open_pubsub

    def held_open(client: redis.Redis, **kwargs: bool) -> PubSub:
        pubsub = real_open(client, **kwargs)
        real_subscribe = pubsub.subscribe

        def subscribe(*channels: str) -> None:
            registered.wait(BOUND_S)  # the poll registers first, however busy the machine
            real_subscribe(*channels)

        pubsub.subscribe = subscribe  # type: ignore[method-assign]
        return pubsub

    monkeypatch.setattr(waiters, "open_pubsub", held_open)
    with notifier.watch("early") as woken:
        registered.set()
        assert woken.wait(BOUND_S), "the first subscription wakes every poll before it"


def test_notifier_wakes_only_the_polls_of_the_published_id(
    notifier: Notifier, client: redis.Redis, keys: Keys, listener_name: str
) -> None:
    with notifier.watch("job-a") as a, notifier.watch("job-b") as b:
        wait_until(notifier.listening, BOUND_S, "a subscription")
        a.clear()
        b.clear()  # the first subscribe wakes every poll once, to re-read
        client.publish(keys.done_channel, "job-a")
        assert a.wait(BOUND_S)
        assert not b.is_set()
        assert notifier.watching("job-a") == 1
    assert notifier.watching("job-a") == 0


def test_notifier_wakes_every_poll_and_resubscribes_when_its_connection_is_killed(
    notifier: Notifier, client: redis.Redis, keys: Keys, listener_name: str
) -> None:
    with notifier.watch("job-a") as a:
        # Listening: its first subscription's wake-up is done, so the next is the kill's.
        wait_until(notifier.listening, BOUND_S, "a subscription")
        [first] = listener_ids(client, listener_name)
        a.clear()
        client.client_kill_filter(_id=str(first))
        assert a.wait(BOUND_S), "a lost subscription must wake its polls to re-read"
        wait_until(lambda: listener_ids(client, listener_name) not in ([], [first])
                   and notifier.listening(), BOUND_S, "a new subscription")
        a.clear()
        client.publish(keys.done_channel, "job-a")
        assert a.wait(BOUND_S)


def test_close_stops_the_listener_thread(
    notifier: Notifier, client: redis.Redis, listener_name: str
) -> None:
    with notifier.watch("job-a"):
        wait_until(lambda: bool(listener_ids(client, listener_name)), BOUND_S, "a subscription")
    notifier.close()  # waits a short while for the thread; a busy machine may take longer
    wait_until(lambda: not any(t.name == "carpool-notifier" and t.is_alive()
                               for t in threading.enumerate()), BOUND_S, "the thread to end")
    wait_until(lambda: not listener_ids(client, listener_name), BOUND_S, "the unsubscription")


def test_a_forked_child_starts_its_own_listener(
    notifier: Notifier, redis_url: str, client: redis.Redis, keys: Keys, listener_name: str
) -> None:
    with notifier.watch("in-parent"):  # the parent's listener runs when the child forks
        wait_until(lambda: len(listener_ids(client, listener_name)) == 1, BOUND_S,
                   "the parent's subscription")
        pid = os.fork()
        if pid == 0:  # the child: no pytest here, only os._exit
            code = 1
            try:
                with notifier.watch("in-child") as woken:
                    own = connect(redis_url)
                    wait_until(lambda: len(listener_ids(own, listener_name)) == 2, BOUND_S,
                               "the child's subscription")
                    woken.clear()
                    own.publish(keys.done_channel, "in-child")
                    code = 0 if woken.wait(BOUND_S) else 2
            finally:
                os._exit(code)
        exit_status: list[int] = []

        def child_exited() -> bool:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                exit_status.append(status)
            return bool(done)

        try:
            wait_until(child_exited, BOUND_S * 2, "the child to exit")
        finally:
            if not exit_status:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(exit_status[0]) == 0


def admit_one(queue: Queue) -> str:
    spec = builtin_models()["synthetic"]
    return single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], new_job_id(spec.name), json.dumps({"value": 1,
                       "size": 1})),), queued_ttl_s=60))).id


def run_all(queue: Queue) -> None:
    """Claims and completes every queued job of the synthetic model's small bin."""
    spec = builtin_models()["synthetic"]
    claim = queue.claim(spec, spec.bins[0].name, 100, lease_ms=30_000, token=uuid.uuid4().hex,
                        worker="w")
    queue.complete(spec, claim, [Outcome(j.id, result={"ok": 1}) for j in claim.jobs],
                   {"size": len(claim.jobs), "bin": spec.bins[0].name, "worker": "w"})


def test_a_lost_connection_forgets_the_pending_ids(
    notifier: Notifier, client: redis.Redis, keys: Keys, listener_name: str
) -> None:
    subscribed(notifier)
    queue = Queue(client, keys)
    job_id = admit_one(queue)
    wait_until(lambda: notifier.pending() == 1, BOUND_S, "the admission notice")
    [first] = listener_ids(client, listener_name)
    client.client_kill_filter(_id=str(first))
    # It ends while this listener is away: its end notice is never heard here.
    run_all(Queue(client, MissedNotices(keys.prefix)))
    wait_until(lambda: listener_ids(client, listener_name) not in ([], [first]), BOUND_S,
               "a new subscription")
    # Forgotten once the listener reads the new subscription's first confirmation.
    wait_until(lambda: notifier.pending() == 0, BOUND_S, "the pending ids forgotten")
    reader = CountingReader(queue)
    started = time.monotonic()
    view = wait_for_final(reader, notifier, job_id, 30.0)
    assert view is not None and view.status is JobStatus.DONE
    # Read first, at once: a poll that waited for a wake-up would sit out the 30 s.
    assert time.monotonic() - started < 10.0 and reader.reads == 1


def test_an_id_never_seen_admitted_is_read_first(notifier: Notifier, client: redis.Redis,
                                                 keys: Keys) -> None:
    queue = Queue(client, keys)
    job_id = admit_one(queue)  # before the listener subscribed
    subscribed(notifier)
    reader = CountingReader(queue)
    got: list[JobView | None] = []
    poll = threading.Thread(target=lambda: got.append(wait_for_final(reader, notifier, job_id,
                                                                     BOUND_S)))
    poll.start()
    wait_until(lambda: reader.reads == 1 and notifier.watching(job_id) == 1, BOUND_S,
               "the poll to read, then wait")
    run_all(queue)
    poll.join(BOUND_S)
    assert got and got[0] is not None and got[0].status is JobStatus.DONE
    assert reader.reads == 2


def test_pending_ids_are_capped_oldest_evicted_first(
    notifier: Notifier, client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiters, "PENDING_CAP", 3)
    subscribed(notifier)
    client.publish(keys.admitted_channel, "a b")
    client.publish(keys.admitted_channel, "c d e")
    wait_until(lambda: notifier.pending() == 3, BOUND_S, "the admission notices")

    def pending(job_id: str) -> bool:
        with notifier.watch_pending(job_id) as (_, known):
            return known

    assert [pending(i) for i in "abcde"] == [False, False, True, True, True]
    client.publish(keys.done_channel, "d")
    wait_until(lambda: notifier.pending() == 2, BOUND_S, "the end notice")
    assert [pending(i) for i in "cde"] == [True, False, True]
