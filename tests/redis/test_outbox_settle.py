"""Settling a webhook try on real Redis: only the lease's holder writes, a retried event
keeps the body its first try sent (the result too, once the record expired), and the
delivery state lives as long as the job's record once settled, a day more only while
it retries."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from carpool.backend.outbox import DELIVERED, Delivery, Event, Outbox
from carpool.backend.queue import Queue
from carpool.core.jobs import Outcome
from carpool.core.settings import load_settings
from carpool.core.shards import shard
from carpool.core.webhooks import hook_field
from carpool.stack.waiting import wait_until
from dispatcher.dispatcher import Dispatcher
from tests.conftest import make_env
from tests.support.hookstack import hook_env
from tests.support.jobs import admit, synthetic
from tests.support.receiver import Received, receiver

URL = "https://example.com/hook"
RETRY = Delivery("retrying", 1, 500, "HTTP 500")


def done_job(queue: Queue, url: str = URL) -> str:
    """A synthetic job with a `done` webhook, completed with result {"echo": 7}."""
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(url, ("done",)))
    claim = queue.claim(spec, spec.bins[0].name, 8, lease_ms=5000, token="t1", worker="w")
    queue.complete(spec, claim, [Outcome(job, result={"echo": 7})],
                   {"size": 1, "bin": claim.bin, "worker": "w"})
    return job


def test_a_try_that_outlived_its_lease_writes_nothing(queue: Queue) -> None:
    job = done_job(queue)
    tag = shard("synthetic")
    a, b = Outbox(queue.client, queue.keys), Outbox(queue.client, queue.keys)
    (late,) = a.take(tag, 10, lease_ms=1).events
    taken: list[Event] = []
    wait_until(lambda: bool(taken.extend(b.take(tag, 10, 60_000).events) or taken), 5.0,
               "the first lease to lapse")
    (current,) = taken
    # The late try's "retry" comes while the other dispatcher holds the event: refused.
    assert not a.settle(late, "retry", RETRY, delay_ms=0, max_age_s=60, body="{}")
    assert queue.client.hgetall(queue.keys.hook_state(job)) == {}
    assert b.settle(current, DELIVERED, Delivery(DELIVERED, 2, 200))
    # ...and after the holder delivered it, the late one cannot overwrite "delivered".
    assert not a.settle(late, "retry", RETRY, delay_ms=0, max_age_s=60)
    (state,) = Outbox(queue.client, queue.keys).deliveries([job])
    assert state["done"].state == DELIVERED and state["done"].attempts == 2
    assert a.waiting([tag]) == 0


def test_delivered_state_lives_as_long_as_the_record_and_only_a_retry_a_day_more(
        queue: Queue) -> None:
    job = done_job(queue)
    tag = shard("synthetic")
    outbox = Outbox(queue.client, queue.keys)
    record_ttl_s = queue.client.ttl(queue.keys.job(job))
    assert 0 < record_ttl_s <= synthetic().result_ttl_s
    (event,) = outbox.take(tag, 10, 5000).events
    assert outbox.settle(event, "retry", RETRY, delay_ms=0, max_age_s=3600, body="{}")
    assert queue.client.ttl(queue.keys.hook_state(job)) > 3600  # kept while it retries
    (event,) = outbox.take(tag, 10, 5000).events
    assert outbox.settle(event, DELIVERED, Delivery(DELIVERED, 2, 200), max_age_s=3600)
    assert 0 < queue.client.ttl(queue.keys.hook_state(job)) <= record_ttl_s
    assert queue.client.hkeys(queue.keys.hook_state(job)) == ["done"]  # the body dropped


@pytest.fixture
def dispatcher(queue: Queue, redis_url: str, key_prefix: str) -> Iterator[Dispatcher]:
    settings = load_settings(make_env(redis_url, key_prefix, **hook_env()))
    d = Dispatcher(settings, queue.client)
    stop = threading.Event()
    thread = threading.Thread(target=d.run, args=(stop,), daemon=True)
    thread.start()
    yield d
    stop.set()
    thread.join(10)


def test_a_retry_after_the_record_expired_still_carries_the_result(
        queue: Queue, dispatcher: Dispatcher) -> None:
    """The record is deleted (its result_ttl_s passed) between the first try, answered
    500, and the second: the second sends the very body of the first, result included."""
    record_gone = threading.Event()

    def answer(n: int, r: Received) -> tuple[int, dict[str, str]]:
        if n == 0:
            queue.client.delete(queue.keys.job(json.loads(r.body)["id"]))
            record_gone.set()
            return 500, {}
        return 200, {}

    with receiver(answer) as rx:
        job = done_job(queue, f"{rx.url}/h")
        wait_until(lambda: len(rx.all()) >= 2, 30.0, "the retry")
        first, second = rx.all()[:2]
    assert record_gone.is_set() and queue.client.exists(queue.keys.job(job)) == 0
    assert second.webhook_id == first.webhook_id == f"{job}.done"
    assert second.body == first.body
    doc = json.loads(second.body)
    assert doc["status"] == "done" and doc["result"] == {"echo": 7}


def test_a_sweep_dead_letters_events_no_dispatcher_took_within_max_age(
        queue: Queue, redis_url: str, key_prefix: str) -> None:
    """An outbox of a shard no catalogued model uses (its model was removed): its events
    overdue past max_age_s are dead-lettered, a bounded number per call; fresh ones and
    those of other shards stay."""
    settings = load_settings(make_env(redis_url, key_prefix,
                                      **hook_env(CARPOOL_WEBHOOK_MAX_AGE_S="60")))
    gone = queue.keys.outbox("zz")
    now_ms = int(queue.client.time()[0]) * 1000
    old = {f"old{i}\tdone\t1\t\thttps://example.com/h": 1 for i in range(3)}
    queue.client.zadd(gone, {**old, "new\tdone\t1\t\thttps://example.com/h": now_ms})
    d = Dispatcher(settings, queue.client)
    try:
        assert "zz" not in d.tags
        assert d.sweep() == 3
        assert queue.client.zrange(gone, 0, -1) == ["new\tdone\t1\t\thttps://example.com/h"]
        dead = Outbox(queue.client, queue.keys).dead(["zz"], 10)
        assert sorted(x["id"] for x in dead) == ["old0", "old1", "old2"]
        assert all(x["state"] == "dead" and "MAX_AGE" in x["last_error"] for x in dead)
        assert Outbox(queue.client, queue.keys).expire("zz", 0.0, 1) == 1  # bounded
    finally:
        d.pool.shutdown()
