"""Webhook events are recorded in the script call that changes the job's state, and the
outbox leases each to one dispatcher at a time (real Redis)."""

from __future__ import annotations

import json

import pytest

from carpool.backend.leases import Leases
from carpool.backend.outbox import DEAD, DELIVERED, Delivery, Outbox, webhook_doc
from carpool.backend.queue import Queue
from carpool.backend.refused_models import RefusedJobs
from carpool.core.catalogue import Catalogue
from carpool.core.jobs import Outcome
from carpool.core.shards import shard
from carpool.core.webhooks import hook_field
from carpool.core.wire import OutboxEvent
from carpool.stack.waiting import wait_until
from tests.support.jobs import admit, synthetic

URL = "https://example.com/hook?x=1"
ALL = ("running", "done", "failed", "expired", "cancelled")


def events(q: Queue, tag: str) -> list[tuple[str, str]]:
    """(job id, event) of each event in the shard's outbox."""
    return sorted((e.subject_id, e.event) for e in
                  map(OutboxEvent.decode, q.client.zrange(q.keys.outbox(tag), 0, -1)))


def claim_one(q: Queue, n: int = 8, **kw: object):  # type: ignore[no-untyped-def]
    spec = synthetic()
    return spec, q.claim(spec, spec.bins[0].name, n, lease_ms=5000, token="t1", worker="w",
                         **kw)  # type: ignore[arg-type]


def test_a_claim_records_running_for_jobs_that_asked_and_no_one_else(queue: Queue) -> None:
    spec = synthetic()
    asked = admit(queue, spec, hook=hook_field(URL, ("running", "done")))
    terminal_only = admit(queue, spec, hook=hook_field(URL, ("done",)))
    plain = admit(queue, spec)
    claim = queue.claim(spec, spec.bins[0].name, 8, lease_ms=5000, token="t1", worker="w")
    assert {j.id for j in claim.jobs} == {asked, terminal_only, plain}
    assert events(queue, shard(spec.name)) == [(asked, "running")]
    assert queue.client.llen(queue.keys.hook_wake(shard(spec.name))) == 1


def test_a_completion_records_done_and_failed_only_for_written_jobs(queue: Queue) -> None:
    spec = synthetic()
    good = admit(queue, spec, hook=hook_field(URL, ALL))
    bad = admit(queue, spec, hook=hook_field(URL, ("failed",)))
    claim = queue.claim(spec, spec.bins[0].name, 8, lease_ms=5000, token="t1", worker="w")
    queue.client.delete(queue.keys.outbox(shard(spec.name)))  # the running events
    done = queue.complete(spec, claim, [Outcome(good, result=1), Outcome(bad, error="boom")],
                          {"size": 2, "bin": claim.bin, "worker": "w"})
    assert done.written == [True, True]
    assert events(queue, shard(spec.name)) == sorted([(good, "done"), (bad, "failed")])
    # A second write (a zombie's) is refused, and so is its event.
    queue.client.delete(queue.keys.outbox(shard(spec.name)))
    again = queue.complete(spec, claim, [Outcome(good, result=1)],
                           {"size": 1, "bin": claim.bin, "worker": "w"})
    assert again.written == [False]
    assert events(queue, shard(spec.name)) == []


def test_a_job_with_a_webhook_is_not_pushed_and_reads_its_delivery(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(URL, ("done",)))
    claim = queue.claim(spec, spec.bins[0].name, 8, lease_ms=5000, token="t1", worker="w")
    queue.complete(spec, claim, [Outcome(job, result=1)], {"size": 1, "bin": claim.bin,
                                                            "worker": "w"})
    view = queue.get(job)
    assert view is not None and view.webhook == {"state": "pending", "attempts": 0,
                                                 "last_status": None, "last_error": None}
    outbox = Outbox(queue.client, queue.keys)
    (event,) = outbox.take(shard(spec.name), 10, 5000).events
    outbox.settle(event, DELIVERED, Delivery(DELIVERED, 1, 200, None, event.t_ms))
    view = queue.get(job)
    assert view is not None and view.to_json()["webhook"] == {
        "state": "delivered", "attempts": 1, "last_status": 200, "last_error": None,
        "event": "done"}


def test_an_expiry_at_claim_records_expired(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(URL, ("expired",)))
    claim = queue.claim(spec, spec.bins[0].name, 8, lease_ms=5000, token="t1", worker="w",
                        queued_ttl_s=0)  # every job queued until now is too old
    assert claim.expired == 1
    assert events(queue, shard(spec.name)) == [(job, "expired")]


def test_a_cancel_records_cancelled(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(URL, ALL))
    assert queue.cancel(job, 60) == "cancelled"
    assert events(queue, shard(spec.name)) == [(job, "cancelled")]


def test_a_job_the_reaper_fails_records_failed(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(URL, ("failed",)))
    queue.claim(spec, spec.bins[0].name, 8, lease_ms=1, token="t1", worker="w")
    leases = Leases(queue.client, queue.keys, Catalogue({spec.name: spec}))
    wait_until(lambda: leases.reap(max_attempts=1).failed == 1, 5.0, "the lease to lapse")
    assert events(queue, shard(spec.name)) == [(job, "failed")]


def test_queued_jobs_of_a_refused_model_record_failed(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(URL, ("failed",)))
    assert RefusedJobs(queue.client, queue.keys).fail_queued(spec, "refused") == 1
    assert events(queue, shard(spec.name)) == [(job, "failed")]


def test_a_taken_event_is_leased_to_one_taker_until_its_lease_ends(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(URL, ("cancelled",)))
    queue.cancel(job, 60)
    tag = shard(spec.name)
    a, b = Outbox(queue.client, queue.keys), Outbox(queue.client, queue.keys)
    first = a.take(tag, 10, lease_ms=200)
    assert [e.job_id for e in first.events] == [job]
    assert first.events[0].webhook_id == f"{job}.cancelled"
    second = b.take(tag, 10, lease_ms=200)
    assert second.events == () and second.next_due_ms is not None
    assert second.next_due_ms > second.now_ms
    taken: list[str] = []
    wait_until(lambda: bool(taken.extend(e.webhook_id for e in b.take(tag, 10, 200).events)
                            or taken), 5.0, "the lease to lapse")
    assert taken == [first.events[0].webhook_id]


def test_settling_dead_takes_the_event_out_and_dead_letters_it(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, hook=hook_field(URL, ("cancelled",)))
    queue.cancel(job, 60)
    tag = shard(spec.name)
    outbox = Outbox(queue.client, queue.keys)
    (event,) = outbox.take(tag, 10, 5000).events
    assert outbox.settle(event, "retry", Delivery("retrying", 1, 500, "HTTP 500", event.t_ms),
                         delay_ms=0)
    (event,) = outbox.take(tag, 10, 5000).events
    assert event.delivery.attempts == 1
    assert outbox.settle(event, DEAD, Delivery(DEAD, 2, 500, "HTTP 500", event.t_ms))
    assert outbox.waiting([tag]) == 0
    (dead,) = outbox.dead([tag], 10)
    assert (dead["id"], dead["event"], dead["attempts"], dead["url"]) == (job, "cancelled", 2,
                                                                          URL)
    # A settle of an event already settled (a second dispatcher's) reports it.
    assert not outbox.settle(event, DELIVERED, Delivery(DELIVERED, 3, 200, None, event.t_ms))
    assert len(outbox.dead([tag], 10)) == 1


@pytest.mark.parametrize("n", [0, 2])
def test_the_document_shows_the_latest_events_delivery(n: int) -> None:
    states = {f"e{i}": Delivery(DELIVERED, 1, 200, None, i) for i in range(n)}
    doc = webhook_doc(states)
    assert doc["state"] == ("pending" if n == 0 else "delivered")
    assert doc.get("event") == (None if n == 0 else "e1")
    assert json.loads(json.dumps(doc)) == doc
