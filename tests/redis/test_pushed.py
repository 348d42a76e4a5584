"""Results pushed with their completion (carpool/backend/pushed.py, web/results/pushed_views.py),
on a real redis-server: what complete.lua and cancel.lua publish, and a web process answering
from it without a Redis read, exactly as a read would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import carpool.backend.pushed
from carpool.backend.keys import Keys
from carpool.backend.leases import Leases
from carpool.backend.pushed import parse
from carpool.backend.queue import Queue
from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import Claim, JobStatus, Outcome
from tests.redis.test_web_waiters import listener_ids
from tests.support.jobs import admit, synthetic
from tests.support.procs import wait_until
from web.results.pushed_views import PushedViews, max_age_for
from web.results.reads import ReadBatcher
from web.results.waiters import Notifier

#: Bound on any one wait here; each normally takes milliseconds.
BOUND_S = 10.0


@pytest.fixture
def results(client: redis.Redis, keys: Keys) -> Iterator[redis.client.PubSub]:
    """A subscriber of the results channel, as a web process is."""
    sub = client.pubsub()
    sub.subscribe(keys.results_channel)
    assert sub.get_message(timeout=BOUND_S)["type"] == "subscribe"
    yield sub
    sub.close()


def next_message(sub: redis.client.PubSub) -> str | None:
    message = sub.get_message(timeout=1.0)
    return None if message is None else str(message["data"])


def run_batch(queue: Queue, n: int, token: str, *, owner: str = "") -> tuple[list[str], Claim]:
    spec = synthetic()
    ids = [admit(queue, spec, value=i, owner=owner) for i in range(n)]
    return ids, queue.claim(spec, "small", n, lease_ms=60_000, token=token, worker="w1")


def test_a_batch_pushes_exactly_the_views_a_read_would_give_of_the_jobs_it_wrote(
        queue: Queue, results: redis.client.PubSub) -> None:
    ids, claim = run_batch(queue, 4, "t1", owner="0wner")
    Leases(queue.client, queue.keys, load_catalogue(None)).release(
        "t1", ids[3:], refund_attempt=True)  # no longer this claim's: its write is refused
    outcomes = [Outcome(ids[0], result={"label": "cat", "p": 0.5}),
                Outcome(ids[1], error="bad input: not an image\nsecond line"),
                Outcome(ids[2], result=[1, 2]), Outcome(ids[3], result="late")]
    assert queue.complete(synthetic(), claim, outcomes, {"size": 4}).written == [True] * 3 + [False]
    message = next_message(results)
    assert message is not None
    pushed = parse(message)
    assert [v.id for v in pushed.views] == ids[:3]
    assert list(pushed.views) == queue.get_many(ids[:3])  # owner, timings, error and all
    assert pushed.views[1].status is JobStatus.FAILED and pushed.views[0].owner == "0wner"


def test_a_result_over_the_push_limit_is_left_to_be_read(
        queue: Queue, results: redis.client.PubSub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(carpool.backend.pushed, "PUSH_MAX_BYTES", 20)
    ids, claim = run_batch(queue, 2, "t2")
    outcomes = [Outcome(ids[0], result="x" * 30), Outcome(ids[1], result=1)]
    assert queue.complete(synthetic(), claim, outcomes, {"size": 2}).written == [True, True]
    message = next_message(results)
    assert message is not None
    assert [v.id for v in parse(message).views] == [ids[1]]


def test_deleting_a_finished_job_is_published_for_every_web_process_to_forget(
        queue: Queue, results: redis.client.PubSub) -> None:
    ids, claim = run_batch(queue, 1, "t3")
    queue.complete(synthetic(), claim, [Outcome(ids[0], result=1)], {"size": 1})
    assert next_message(results) is not None
    assert queue.cancel(ids[0], 60) == "deleted"
    message = next_message(results)
    assert message is not None and parse(message).deleted == (ids[0],)


@pytest.fixture
def notifier(redis_url: str, keys: Keys, key_prefix: str) -> Iterator[Notifier]:
    own = redis.Redis.from_url(redis_url, decode_responses=True,
                               client_name=f"pushed-{key_prefix}", socket_timeout=5.0)
    n = Notifier(own, keys.done_channel, keys.admitted_channel, keys.results_channel)
    yield n
    n.close()
    own.close()


def listening(notifier: Notifier, client: redis.Redis, key_prefix: str) -> list[int]:
    wait_until(notifier.listening, BOUND_S, "a subscription")  # (starts the listener)
    return listener_ids(client, f"pushed-{key_prefix}")


def test_a_poll_for_a_job_that_already_ended_needs_no_redis_read(
        queue: Queue, notifier: Notifier, client: redis.Redis, key_prefix: str) -> None:
    listening(notifier, client, key_prefix)
    reads = ReadBatcher(queue, notifier.pushed_view)
    ids, claim = run_batch(queue, 3, "t4")
    queue.complete(synthetic(), claim, [Outcome(i, result=i) for i in ids], {"size": 3})
    wait_until(lambda: notifier.pushed_view(ids[2]) is not None, BOUND_S, "the push")
    views = [reads.get(i) for i in ids]
    assert reads.calls.round_trips == 0
    assert views == queue.get_many(ids)
    assert reads.get("s8wnotpushed000000000000") is None and reads.calls.round_trips == 1


def test_a_deleted_job_is_forgotten_and_a_broken_subscription_forgets_everything(
        queue: Queue, notifier: Notifier, client: redis.Redis, key_prefix: str) -> None:
    [first] = listening(notifier, client, key_prefix)
    ids, claim = run_batch(queue, 2, "t5")
    queue.complete(synthetic(), claim, [Outcome(i, result=i) for i in ids], {"size": 2})
    wait_until(lambda: notifier.pushed_view(ids[1]) is not None, BOUND_S, "the push")
    queue.cancel(ids[0], 60)
    wait_until(lambda: notifier.pushed_view(ids[0]) is None, BOUND_S, "the deletion heard")
    assert notifier.pushed_view(ids[1]) is not None
    # A message published while the listener is away would be lost: what it holds may
    # be stale, so a new subscription starts from nothing.
    client.client_kill_filter(_id=str(first))
    wait_until(lambda: listener_ids(client, f"pushed-{key_prefix}") not in ([], [first]),
               BOUND_S, "a new subscription")
    # Dropped once the listener reads that subscription's first confirmation (views
    # age out only after MAX_AGE_S, far past the bound).
    wait_until(lambda: notifier.pushed_view(ids[1]) is None, BOUND_S, "the views dropped")


def test_pushed_views_age_out_and_keep_to_their_byte_budget(queue: Queue) -> None:
    ids, claim = run_batch(queue, 3, "t6")
    queue.complete(synthetic(), claim, [Outcome(i, result=i) for i in ids], {"size": 3})
    views = queue.get_many(ids)
    now = [0.0]
    kept = PushedViews(max_age_s=10.0, max_bytes=250, clock=lambda: now[0])
    kept.put([v for v in views if v is not None], 100)  # 300 bytes: the oldest goes
    assert kept.get(ids[0]) is None and kept.get(ids[1]) == views[1]
    now[0] = 10.5
    assert kept.get(ids[2]) is None and len(kept) == 1
    assert max_age_for([3600, 40]) == 20.0 and max_age_for([3600]) == 30.0
