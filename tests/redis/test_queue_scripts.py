"""Each Lua script's contract on a real redis-server."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace

import pytest

from carpool.admission.retry_after import DRAIN_TAU_MS, drain_rate_per_s
from carpool.backend import records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.connection import connect
from carpool.backend.keys import shard_of_job
from carpool.backend.queue import Queue, ended_ids
from carpool.core.errors import BinFull, IdempotencyConflict, NotCancellable
from carpool.core.jobs import JobStatus, Outcome, new_job_id
from carpool.scheduling.batching import Cost
from tests.support.jobs import admit, synthetic

TTL_S = 60


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
    assert queue.complete(
        spec, claim, [Outcome(job, result="first")], {"size": 1}).written == [True]
    assert queue.complete(
        spec, claim, [Outcome(job, result="second")], {"size": 1}).written == [False]
    view = queue.get(job)
    assert view is not None and view.status is JobStatus.DONE and view.result == "first"


def test_a_claim_with_another_token_cannot_write(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="mine", worker="w")
    zombie = replace(claim, token="someone-else")
    assert queue.complete(spec, zombie, [Outcome(job, result="x")], {"size": 1}).written == [False]
    assert queue.get(job).status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_failed_outcome_records_the_error_and_the_rest_complete(queue: Queue) -> None:
    spec = synthetic()
    a, b = admit(queue, spec), admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    outs = [Outcome(a, error="bad input"), Outcome(b, result={"ok": 1})]
    assert queue.complete(spec, claim, outs, {"size": 2}).written == [True, True]
    va, vb = queue.get(a), queue.get(b)
    assert va is not None and va.status is JobStatus.FAILED and va.error == "bad input"
    assert vb is not None and vb.status is JobStatus.DONE and vb.result == {"ok": 1}


def test_completion_publishes_the_batch_ids_on_the_done_channel_once(queue: Queue) -> None:
    spec = synthetic()
    jobs = [admit(queue, spec), admit(queue, spec)]
    pubsub = queue.client.pubsub()
    pubsub.subscribe(queue.keys.done_channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    queue.complete(spec, claim, [Outcome(j, result=1) for j in jobs], {"size": 2})
    msg = pubsub.get_message(timeout=2)
    assert msg is not None and ended_ids(msg["data"]) == jobs
    assert pubsub.get_message(timeout=0.2) is None  # one message for the whole batch
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
    records.update(queue.client, queue.keys.job(job), deadline=1)  # long past, Redis's clock
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w")
    assert claim.jobs == () and claim.expired == 1
    assert queue.get(job).status is JobStatus.EXPIRED  # type: ignore[union-attr]


def test_a_job_its_batch_cannot_finish_by_its_deadline_ends_expired_at_its_claim(
        queue: Queue) -> None:
    spec = synthetic()
    soon = admit(queue, spec, value="soon", deadline_ms=2_000)
    later = admit(queue, spec, value="later", deadline_ms=60_000)
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w",
                        cost=Cost(4_000.0, 500.0))  # two jobs: 5 s
    assert [j.id for j in claim.jobs] == [later] and claim.expired == 1
    view = queue.get(soon)
    assert view is not None and view.status is JobStatus.EXPIRED
    assert view.error is not None and view.error.startswith("cannot finish by its deadline")
    assert view.error.endswith("its batch takes about 5000 ms")


def test_the_batch_a_claim_judges_by_leaves_out_the_dead_jobs_ahead(queue: Queue) -> None:
    spec = synthetic()
    dead = [admit(queue, spec, value=f"dead{i}", deadline_ms=1) for i in range(6)]
    for job in dead:
        records.update(queue.client, queue.keys.job(job), deadline=1)  # long past
    soon = [admit(queue, spec, value=f"soon{i}", deadline_ms=2_000) for i in range(2)]
    # Eight jobs would take 500 + 8·200 = 2.1 s, past the 2 s; the two live ones 0.9 s.
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w",
                        cost=Cost(500.0, 200.0))
    assert [j.id for j in claim.jobs] == soon and claim.expired == 6


def test_a_job_queued_longer_than_the_queued_ttl_ends_expired_at_its_claim(
        queue: Queue) -> None:
    spec = synthetic()
    old, new = admit(queue, spec, value="old"), admit(queue, spec, value="new")
    record = queue.keys.job(old)
    assert queue.client.ttl(record) == -1  # no TTL while queued: the claim bounds its wait
    t_admit = int((records.read(queue.client, record) or {}).get("t_admit", 0))
    records.update(queue.client, record, t_admit=t_admit - 61_000)  # queued 61 s, Redis's clock
    claim = queue.claim(spec, "small", 8, lease_ms=5000, token="t", worker="w", queued_ttl_s=60)
    assert [j.id for j in claim.jobs] == [new] and claim.expired == 1
    view = queue.get(old)
    assert view is not None and view.status is JobStatus.EXPIRED
    assert view.error == "queued longer than CARPOOL_QUEUED_TTL_S (60 s)"
    assert 0 < queue.client.ttl(record) <= spec.result_ttl_s  # kept as a result is


def test_same_idempotency_key_returns_the_first_job(queue: Queue) -> None:
    spec = synthetic()
    body = json.dumps({"value": 1, "size": 1})
    first = single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], new_job_id(spec.name), body),),
        queued_ttl_s=TTL_S, idempotency_digest="k1", input_digest="d1")))
    again = single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], new_job_id(spec.name), body),),
        queued_ttl_s=TTL_S, idempotency_digest="k1", input_digest="d1")))
    assert again.id == first.id and again.duplicate
    assert queue.depths([("synthetic", "small")]) == [1]
    with pytest.raises(IdempotencyConflict):
        single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
            spec, (AdmitJob(spec.bins[0], new_job_id(spec.name), body),),
            queued_ttl_s=TTL_S, idempotency_digest="k1", input_digest="other")))


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
    admitted_ms = int((records.read(queue.client, queue.keys.job(first)) or {})["t_admit"])
    assert (small.depth, small.oldest_admit_ms) == (2, admitted_ms)
    assert (large.depth, large.oldest_admit_ms) == (0, None)
    assert now_ms >= admitted_ms



def test_a_claim_writes_nothing_to_its_jobs_records_and_a_read_says_running(
        queue: Queue) -> None:
    spec = synthetic()
    job, waiting = admit(queue, spec), admit(queue, spec)
    before = queue.client.get(queue.keys.job(job))
    claim = queue.claim(spec, "small", 1, lease_ms=5000, token="t", worker="w")
    assert [j.id for j in claim.jobs] == [job]
    assert queue.client.get(queue.keys.job(job)) == before  # still says "queued"
    # The attempt is counted in the claim hash, not in the record.
    assert queue.client.hget(queue.keys.claim(shard_of_job(job), "t"), job) == "1"
    views = queue.get_many([job, waiting])
    assert [v.status if v else None for v in views] == [JobStatus.RUNNING, JobStatus.QUEUED]


def test_a_finished_record_carries_its_attempt_count_and_drops_its_input(
        queue: Queue) -> None:
    spec = synthetic()
    first, again = admit(queue, spec), admit(queue, spec)
    records.update(queue.client, queue.keys.job(again), attempts=1)  # lost once before
    claim = queue.claim(spec, "small", 2, lease_ms=5000, token="t", worker="w")
    assert [j.attempts for j in claim.jobs] == [1, 2]
    queue.complete(spec, claim, [Outcome(j.id, result={}) for j in claim.jobs],
                   {"size": 2, "bin": "small", "worker": "w"})
    done = [records.read(queue.client, queue.keys.job(j)) or {} for j in (first, again)]
    assert [d.get("attempts") for d in done] == ["1", "2"]
    assert [json.loads(d["batch"])["worker"] for d in done] == ["w", "w"]
    assert all('"value"' not in (queue.client.get(queue.keys.job(j)) or "")
               for j in (first, again))  # the inputs went with the queued records


def test_a_completion_answers_the_same_bin_states_as_a_peek_after_it(queue: Queue) -> None:
    spec = synthetic(max_batch=4)
    for value in range(6):
        admit(queue, spec, value=value)
    admit(queue, spec, size=500, deadline_ms=9000)  # the large bin
    claim = queue.claim(spec, "small", 4, lease_ms=5000, token="t", worker="w")
    done = queue.complete(spec, claim, [Outcome(j.id, result={}) for j in claim.jobs],
                          {"size": 4, "bin": "small", "worker": "w"},
                          peek=["small", "large"], scan=[4, 4])
    now_ms, states = queue.peek([("synthetic", "small"), ("synthetic", "large")], scan=[4, 4])
    assert done.written == [True] * 4
    assert done.states == states
    assert [s.depth for s in states] == [2, 1] and states[1].earliest_deadline_ms
    assert claim.now_ms <= done.now_ms <= now_ms
    assert queue.complete(spec, claim, [], {}).states is None  # none asked


def test_a_completion_asked_to_peek_without_each_bins_scan_writes_nothing(
        queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 1, lease_ms=5000, token="t", worker="w")
    with pytest.raises(ValueError, match="one max_batch per bin"):
        queue.complete(spec, claim, [Outcome(job, result={})], {},
                       peek=["small", "large"], scan=[32])
    assert queue.get(job).status == JobStatus.RUNNING  # type: ignore[union-attr]


def test_completions_keep_a_drain_rate_and_retry_after_grows_with_depth(queue: Queue) -> None:
    spec = synthetic()
    for _ in range(3):
        jobs = [admit(queue, spec) for _ in range(10)]
        claim = queue.claim(spec, "small", 10, lease_ms=5000, token="t", worker="w")
        queue.complete(spec, claim, [Outcome(j, result=1) for j in jobs], {"size": 10})
    drained_at_s = time.monotonic()
    stats = queue.client.hgetall(queue.keys.stats("synthetic", "small"))
    assert stats["drained"] == "30" and float(stats["rate_c"]) > 29
    for depth in (60, 240):
        # The depth bound's answer: admission by predicted wait off (tests/redis/test_admission.py).
        bounded = replace(synthetic(max_depth=depth, max_batch=1), max_queue_ms=0)
        while True:
            try:
                admit(queue, bounded)
            except BinFull as full:
                answer_s, since_s = full.retry_after_s, time.monotonic() - drained_at_s
                break
        # 30 jobs drained, read as a rate over at least a second: about 31.5 jobs/s, less
        # the decay since (filling a deep bin takes a while on a busy machine).
        slowest_rate = drain_rate_per_s(30 * math.exp(-since_s * 1000 / DRAIN_TAU_MS),
                                        int(since_s * 1000))
        assert depth / 31.5 * 0.95 <= answer_s <= depth / slowest_rate * 1.05


def test_a_batch_admitted_in_one_call_keeps_its_order_and_wakes_once(queue: Queue) -> None:
    spec = synthetic(max_batch=4)
    small = spec.bins[0]
    wake = queue.keys.wake("synthetic")
    ids = [new_job_id(spec.name) for _ in range(6)]
    out = Admissions(queue.client, queue.keys).admit(AdmitRequest(spec, tuple(
        AdmitJob(small, i, json.dumps({"value": n, "size": 1})) for n, i in enumerate(ids)),
        TTL_S))
    assert [o.id for o in out if not isinstance(o, Exception)] == ids
    assert queue.client.llen(wake) == 1  # first jobs and a full batch: one wake-up, not six
    claim = queue.claim(spec, "small", 6, lease_ms=5000, token="t", worker="w")
    assert [j.id for j in claim.jobs] == ids  # the batch's order, not the ids' order
    assert [json.loads(j.input_json)["value"] for j in claim.jobs] == list(range(6))


def test_a_batch_into_a_nearly_full_bin_queues_what_fits_and_refuses_the_rest(
        queue: Queue) -> None:
    spec = synthetic(max_depth=3)
    admit(queue, spec)
    ids = [new_job_id(spec.name) for _ in range(4)]
    out = Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, tuple(AdmitJob(spec.bins[0], i, "{}") for i in ids), TTL_S))
    assert [type(o).__name__ for o in out] == ["Admitted", "Admitted", "BinFull", "BinFull"]
    assert queue.client.zcard(queue.keys.bin("synthetic", "small")) == 3
    assert queue.client.exists(queue.keys.job(ids[2])) == 0  # a refused job leaves nothing


def test_an_id_of_another_models_shard_is_refused_before_any_write(queue: Queue) -> None:
    spec = synthetic()
    foreign = new_job_id("another-model")
    with pytest.raises(ValueError, match="make it with carpool.core.jobs.new_job_id"):
        single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
            spec, (AdmitJob(spec.bins[0], foreign, "{}"),), queued_ttl_s=TTL_S)))
    assert queue.client.zcard(queue.keys.bin("synthetic", "small")) == 0



def test_admit_publishes_the_ids_it_queued_and_nothing_when_it_queues_none(
        queue: Queue) -> None:
    spec = synthetic(max_depth=3)
    pubsub = queue.client.pubsub()
    pubsub.subscribe(queue.keys.admitted_channel)
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    first = admit(queue, spec)
    ids = [new_job_id(spec.name) for _ in range(4)]
    Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, tuple(AdmitJob(spec.bins[0], i, "{}") for i in ids), TTL_S))
    with pytest.raises(BinFull):  # refused whole: no message
        admit(queue, spec)
    other = admit(queue, synthetic(), size=100)  # the next message: the refusal sent none
    messages = []
    while len(messages) < 3:
        message = pubsub.get_message(timeout=5)
        assert message is not None, messages
        messages.append(ended_ids(message["data"]))
    pubsub.close()
    assert messages == [[first], ids[:2], [other]]  # only the jobs admitted, in order
