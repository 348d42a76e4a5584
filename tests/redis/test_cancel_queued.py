"""cancel.lua's queued-only mode on a real redis-server: a caller who hung up cancels its
job only while it is queued; a claimed, running or finished job is never touched."""

from __future__ import annotations

import threading

from carpool.backend.connection import connect
from carpool.backend.queue import Queue, ended_ids
from carpool.core.jobs import JobStatus, Outcome
from tests.support.jobs import admit, synthetic

TTL_S = 60
REASON = "client_gone: the caller hung up while the job was queued"


def test_a_queued_job_is_cancelled_with_the_reason_and_leaves_its_bin(queue: Queue) -> None:
    spec = synthetic()
    keep, drop = admit(queue, spec), admit(queue, spec)
    pubsub = queue.client.pubsub()
    pubsub.subscribe(queue.keys.done_channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    assert queue.cancel_queued(drop, TTL_S, REASON) == "cancelled"
    view = queue.get(drop)
    assert view is not None and view.status is JobStatus.CANCELLED and view.error == REASON
    msg = pubsub.get_message(timeout=2)  # its long-polls wake
    assert msg is not None and ended_ids(msg["data"]) == [drop]
    pubsub.close()
    assert queue.depths([("synthetic", "small")]) == [1]
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    assert [j.id for j in claim.jobs] == [keep]


def test_a_claimed_job_is_left_running_and_still_completes(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    assert queue.cancel_queued(job, TTL_S, REASON) == "running"
    queue.complete(spec, claim, [Outcome(job, result=7)], {"size": 1})
    view = queue.get(job)
    assert view is not None and view.status is JobStatus.DONE and view.result == 7


def test_a_finished_job_is_kept_not_deleted(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    queue.complete(spec, claim, [Outcome(job, result=1)], {"size": 1})
    assert queue.cancel_queued(job, TTL_S, REASON) == "ended"
    view = queue.get(job)
    assert view is not None and view.status is JobStatus.DONE  # a plain cancel deletes it
    assert queue.cancel_queued("Zzzz" + "a" * 22, TTL_S, REASON) == "missing"


def test_an_idempotency_key_goes_with_its_cancelled_job(queue: Queue) -> None:
    spec = synthetic()
    first = admit(queue, spec, idempotency_digest="d" * 64, input_digest="i")
    assert queue.cancel_queued(first, TTL_S, REASON) == "cancelled"
    again = admit(queue, spec, idempotency_digest="d" * 64, input_digest="i")
    assert again != first  # a retry with the key queues a new job


def test_racing_claims_each_job_is_either_claimed_or_cancelled_never_both(
        queue: Queue, redis_url: str) -> None:
    spec = synthetic(max_batch=4)
    jobs = [admit(queue, spec, value=i) for i in range(400)]
    claimed: list[str] = []

    def claim_all() -> None:
        q = Queue(connect(redis_url), queue.keys)
        for n in range(200):
            claim = q.claim(spec, "small", 4, lease_ms=60_000, token=f"t{n}", worker="w")
            claimed.extend(j.id for j in claim.jobs)
        q.client.close()

    claimer = threading.Thread(target=claim_all)
    claimer.start()
    answers = {job: queue.cancel_queued(job, TTL_S, REASON) for job in jobs}
    claimer.join()
    cancelled = [job for job, answer in answers.items() if answer == "cancelled"]
    assert set(answers.values()) <= {"cancelled", "running"}
    assert sorted(claimed + cancelled) == sorted(jobs)  # each once: claimed xor cancelled
    assert not set(claimed) & set(cancelled)
    assert all(answers[job] == "running" for job in claimed)
    assert queue.depths([("synthetic", "small")]) == [0]
