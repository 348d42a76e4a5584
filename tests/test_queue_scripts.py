"""Each Lua script's contract on a real redis-server."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest

from carpool.catalogue import ModelSpec, load_catalogue
from carpool.errors import BinFull, IdempotencyConflict, NotCancellable
from carpool.jobs import JobStatus, Outcome, new_job_id
from carpool.queue import Queue, connect

TTL_S = 60


def synthetic(max_depth: int = 5000, max_batch: int = 32) -> ModelSpec:
    spec = load_catalogue(None).get("synthetic")
    bins = tuple(replace(b, max_depth=max_depth, max_batch=min(max_batch, max_depth))
                 for b in spec.bins)
    return replace(spec, bins=bins)


def admit(q: Queue, spec: ModelSpec, size: int = 1, value: object = 0, **kw: object) -> str:
    body = json.dumps({"value": value, "size": size})
    return q.admit(spec, spec.bin_for(size), new_job_id(), body, queued_ttl_s=TTL_S,
                   **kw).id  # type: ignore[arg-type]


def test_depth_bound_is_exact_under_concurrent_admits(queue: Queue, redis_url: str) -> None:
    spec = synthetic(max_depth=100)
    admitted, refused = [], []
    lock = threading.Lock()

    def flood() -> None:
        q = Queue(connect(redis_url), queue.keys)
        for _ in range(60):
            try:
                job = admit(q, spec)
                with lock:
                    admitted.append(job)
            except BinFull:
                with lock:
                    refused.append(1)

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 100 and len(refused) == 380
    assert queue.depths([("synthetic", "small")]) == [100]


def test_bin_full_carries_a_retry_after(queue: Queue) -> None:
    spec = synthetic(max_depth=1, max_batch=1)
    admit(queue, spec)
    with pytest.raises(BinFull) as info:
        admit(queue, spec)
    assert info.value.retry_after_s >= 1


def test_claim_is_fifo_within_a_bin(queue: Queue) -> None:
    spec = synthetic()
    ids = [admit(queue, spec, value=i) for i in range(10)]
    claim = queue.claim(spec, "small", 4, lease_ms=5000, token="t", worker="w")
    assert [j.id for j in claim.jobs] == ids[:4]
    claim2 = queue.claim(spec, "small", 100, lease_ms=5000, token="t2", worker="w")
    assert [j.id for j in claim2.jobs] == ids[4:]


def test_claim_takes_at_most_n_and_only_from_its_bin(queue: Queue) -> None:
    spec = synthetic()
    small = [admit(queue, spec, size=1) for _ in range(5)]
    medium = [admit(queue, spec, size=100) for _ in range(5)]
    claim = queue.claim(spec, "medium", 3, lease_ms=5000, token="t", worker="w")
    assert len(claim.jobs) == 3 and {j.id for j in claim.jobs} <= set(medium)
    assert queue.depths([("synthetic", "small"), ("synthetic", "medium")]) == [5, 2]
    assert all(queue.get(i).status is JobStatus.QUEUED for i in small)  # type: ignore[union-attr]


def test_claim_returns_inputs_admission_times_and_attempts(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, value={"k": [1, 2]})
    now_ms, states = queue.peek([("synthetic", "small")])
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    (got,) = claim.jobs
    assert got.id == job and json.loads(got.input_json)["value"] == {"k": [1, 2]}
    assert got.admit_ms == states[0].oldest_admit_ms <= now_ms <= claim.now_ms
    assert got.attempts == 1
    assert queue.get(job).status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_a_result_is_written_once(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    assert queue.complete(spec, claim, [Outcome(job, result="first")], {"size": 1}) == [True]
    assert queue.complete(spec, claim, [Outcome(job, result="second")], {"size": 1}) == [False]
    view = queue.get(job)
    assert view is not None and view.status is JobStatus.DONE and view.result == "first"


def test_a_claim_with_another_token_cannot_write(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="mine", worker="w")
    zombie = replace(claim, token="someone-else")
    assert queue.complete(spec, zombie, [Outcome(job, result="x")], {"size": 1}) == [False]
    assert queue.get(job).status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_failed_outcome_records_the_error_and_the_rest_complete(queue: Queue) -> None:
    spec = synthetic()
    a, b = admit(queue, spec), admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    outs = [Outcome(a, error="bad input"), Outcome(b, result={"ok": 1})]
    assert queue.complete(spec, claim, outs, {"size": 2}) == [True, True]
    va, vb = queue.get(a), queue.get(b)
    assert va is not None and va.status is JobStatus.FAILED and va.error == "bad input"
    assert vb is not None and vb.status is JobStatus.DONE and vb.result == {"ok": 1}


def test_completion_publishes_each_id_on_the_done_channel(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    pubsub = queue.client.pubsub()
    pubsub.subscribe(queue.keys.done_channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    queue.complete(spec, claim, [Outcome(job, result=1)], {"size": 1})
    msg = pubsub.get_message(timeout=2)
    assert msg is not None and msg["data"] == job
    pubsub.close()


def test_cancel_removes_a_queued_job_from_its_bin(queue: Queue) -> None:
    spec = synthetic()
    keep, drop = admit(queue, spec), admit(queue, spec)
    assert queue.cancel(drop, TTL_S) == "cancelled"
    assert queue.get(drop).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    assert [j.id for j in claim.jobs] == [keep]


def test_cancel_refuses_a_running_job_and_deletes_a_finished_one(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    with pytest.raises(NotCancellable):
        queue.cancel(job, TTL_S)
    queue.complete(spec, claim, [Outcome(job, result=1)], {"size": 1})
    assert queue.cancel(job, TTL_S) == "deleted"
    assert queue.get(job) is None
    assert queue.cancel(job, TTL_S) == "missing"


def test_an_expired_deadline_is_never_claimed(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, deadline_ms=1)
    queue.client.hset(queue.keys.job(job), "deadline", 1)  # long past, on Redis's clock
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    assert claim.jobs == ()
    assert queue.get(job).status is JobStatus.EXPIRED  # type: ignore[union-attr]


def test_same_idempotency_key_returns_the_first_job(queue: Queue) -> None:
    spec = synthetic()
    body = json.dumps({"value": 1, "size": 1})
    first = queue.admit(spec, spec.bins[0], new_job_id(), body, queued_ttl_s=TTL_S,
                        idempotency_digest="k1", input_digest="d1")
    again = queue.admit(spec, spec.bins[0], new_job_id(), body, queued_ttl_s=TTL_S,
                        idempotency_digest="k1", input_digest="d1")
    assert again.id == first.id and again.duplicate
    assert queue.depths([("synthetic", "small")]) == [1]
    with pytest.raises(IdempotencyConflict):
        queue.admit(spec, spec.bins[0], new_job_id(), body, queued_ttl_s=TTL_S,
                    idempotency_digest="k1", input_digest="other")


def test_admission_wakes_a_worker_on_a_new_oldest_job_and_on_a_full_batch(queue: Queue) -> None:
    spec = synthetic(max_batch=3)
    wake = queue.keys.wake("synthetic")
    admit(queue, spec)
    assert queue.client.llen(wake) == 1  # bin was empty: a new deadline
    admit(queue, spec)
    assert queue.client.llen(wake) == 1  # nothing changed for a worker
    admit(queue, spec)
    assert queue.client.llen(wake) == 2  # a full batch
    assert queue.wait_for_work(["synthetic"], 0.1)


def test_peek_reports_depth_and_oldest_admission(queue: Queue) -> None:
    spec = synthetic()
    first = admit(queue, spec)
    admit(queue, spec)
    now_ms, (small, large) = queue.peek([("synthetic", "small"), ("synthetic", "large")])
    admitted_ms = int(queue.client.hget(queue.keys.job(first), "t_admit"))  # type: ignore[arg-type]
    assert (small.depth, small.oldest_admit_ms) == (2, admitted_ms)
    assert (large.depth, large.oldest_admit_ms) == (0, None)
    assert now_ms >= admitted_ms

