"""A job's record: what the Lua scripts write is what ``carpool.backend.records`` reads, field by
field, through a job's whole life on a real Redis."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from carpool.backend import records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.keys import shard_of_job
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.jobs import Claim, JobStatus, Outcome, new_job_id
from tests.support.jobs import synthetic

TTL_S = 3600


def admit_and_claim(queue: Queue, spec: ModelSpec, admitted: int,
                    claimed: int) -> tuple[list[str], Claim]:
    jobs = [new_job_id(spec.name) for _ in range(admitted)]
    for job in jobs:
        single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
            spec, (AdmitJob(spec.bins[0], job, '{"value": 1, "size": 1}'),), queued_ttl_s=TTL_S)))
    return jobs, queue.claim(spec, spec.bins[0].name, claimed, lease_ms=5000, token="t",
                             worker="w")


def test_a_record_python_writes_is_one_the_scripts_claim_and_complete(queue: Queue) -> None:
    """Every header field set, in Python's order: the claim reads each where Python put
    it, and the completion keeps them where Python reads them back."""
    spec = synthetic()
    job = new_job_id(spec.name)
    seconds, micros = queue.client.time()
    now_ms = seconds * 1000 + micros // 1000  # Redis's clock: a claim expires stale jobs
    written = {"status": "queued", "attempts": "2", "t_admit": str(now_ms),
               "deadline": "9999999999999", "owner": "o" * 64, "score": f"{now_ms}123",
               "model": spec.name, "bin": spec.bins[0].name, "priority": "4",
               "digest": "d" * 64, "idem": "{x}:idem:k", "hook": "rd https://example.com/h?a=1",
               "input": '{"value": "\t", "size": 1}'}
    assert tuple(k for k in written if k != "input") == records.HEAD
    queue.client.set(queue.keys.job(job), records.build(written))
    queue.client.zadd(queue.keys.bin(spec.name, spec.bins[0].name), {job: 1})
    claim = queue.claim(spec, spec.bins[0].name, 1, lease_ms=5000, token="t", worker="w")
    (got,) = claim.jobs
    assert (got.input_json, got.admit_ms, got.attempts, got.owner) == (
        written["input"], now_ms, 3, "o" * 64)
    queue.complete(spec, claim, [Outcome(job, result={"ok": 1})],
                   {"size": 1, "bin": spec.bins[0].name, "worker": "w"})
    done = records.read(queue.client, queue.keys.job(job)) or {}
    kept = {k: v for k, v in written.items() if k not in ("status", "attempts", "input")}
    assert {k: done.get(k) for k in kept} == kept
    assert (done["status"], done["attempts"], done["result"]) == ("done", "3", '{"ok": 1}')
    assert tuple(done)[:len(records.HEAD + records.ENDED)] == records.HEAD + records.ENDED


def test_an_admitted_record_holds_every_option_and_no_input(queue: Queue) -> None:
    spec = synthetic()
    job = new_job_id(spec.name)
    body = json.dumps({"value": "a\tb\nc", "size": 1})  # the input may hold anything
    single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], job, body),),
        queued_ttl_s=TTL_S, deadline_ms=5000, priority=3, idempotency_digest="k" * 16,
        input_digest="d" * 16, owner="o" * 16, hook="df https://example.com/h")))
    record = records.read(queue.client, queue.keys.job(job))
    assert record is not None
    assert record["status"] == "queued" and "attempts" not in record  # never claimed
    assert (record["model"], record["bin"]) == (spec.name, spec.bins[0].name)
    assert int(record["deadline"]) == int(record["t_admit"]) + 5000
    assert (record["priority"], record["owner"], record["digest"]) == ("3", "o" * 16, "d" * 16)
    assert record["idem"] == queue.keys.idempotency(spec.name, "k" * 16)
    assert record["hook"] == "df https://example.com/h"
    score = queue.client.zscore(queue.keys.bin(spec.name, spec.bins[0].name), job)
    assert float(record["score"]) == score
    assert record["input"] == body
    read = queue.read_records([job])[0]  # what GET /result reads: never the input
    assert read is not None and read.pop("position") == "0"  # its place in its bin
    assert read == {k: v for k, v in record.items() if k != "input"}


def test_a_done_record_keeps_its_admission_and_adds_its_end(queue: Queue) -> None:
    spec = synthetic()
    job = new_job_id(spec.name)
    single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], job, '{"value": 1, "size": 1}'),),
        queued_ttl_s=TTL_S, priority=2, owner="o" * 16)))
    admitted = records.read(queue.client, queue.keys.job(job)) or {}
    claim = queue.claim(spec, spec.bins[0].name, 1, lease_ms=5000, token="t", worker="w9")
    queue.complete(spec, claim, [Outcome(job, result={"multi\nline": "x\ty"},
                                         preprocess_ms=1.5, inference_ms=2.0)],
                   {"size": 1, "bin": spec.bins[0].name, "worker": "w9"})
    done = records.read(queue.client, queue.keys.job(job)) or {}
    kept = {k: v for k, v in admitted.items() if k not in ("status", "input")}
    assert {k: done[k] for k in kept} == kept
    assert (done["status"], done["attempts"], done["t_claim"]) == ("done", "1", str(claim.now_ms))
    assert int(done["t_done"]) >= claim.now_ms
    assert json.loads(done["timings"]) == {"preprocess": 1.5, "inference": 2.0,
                                           "device": 0.0}
    assert json.loads(done["batch"])["worker"] == "w9"
    assert json.loads(done["result"]) == {"multi\nline": "x\ty"}
    assert 0 < queue.client.ttl(queue.keys.job(job)) <= spec.result_ttl_s
    assert '"value"' not in (queue.client.get(queue.keys.job(job)) or "")  # the input went


def test_a_failed_and_a_cancelled_record_carry_their_error(queue: Queue) -> None:
    spec = synthetic()
    bad, dropped = new_job_id(spec.name), new_job_id(spec.name)
    for job in (bad, dropped):
        single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
            spec, (AdmitJob(spec.bins[0], job, '{"value": 1, "size": 1}'),), queued_ttl_s=TTL_S)))
    claim = queue.claim(spec, spec.bins[0].name, 1, lease_ms=5000, token="t", worker="w")
    queue.complete(spec, claim, [Outcome(bad, error="line one\nline two")],
                   {"size": 1, "bin": spec.bins[0].name, "worker": "w"})
    assert queue.cancel(dropped, TTL_S) == "cancelled"
    failed = records.read(queue.client, queue.keys.job(bad)) or {}
    cancelled = records.read(queue.client, queue.keys.job(dropped)) or {}
    assert (failed["status"], failed["error"]) == ("failed", "line one\nline two")
    assert (cancelled["status"], cancelled["error"]) == ("cancelled", "cancelled by the client")
    assert cancelled["model"] == spec.name and "t_claim" not in cancelled
    assert all('"value"' not in (queue.client.get(queue.keys.job(j)) or "")
               for j in (bad, dropped))  # the inputs went with the queued records


def test_a_record_written_by_hand_reads_back_the_same() -> None:
    fields = {"status": "done", "attempts": "2", "t_admit": "1", "score": "1000", "model": "m",
              "bin": "b", "t_claim": "5", "t_done": "9", "batch": '{"size": 1}',
              "result": '{"a": 1}'}
    assert records.parse(records.build(fields)) == fields
    queued = {"status": "queued", "t_admit": "1", "model": "m", "bin": "b",
              "input": '{"a":\n1}'}
    assert records.parse(records.build(queued)) == queued


def test_a_read_says_running_for_a_claimed_job_and_returns_a_long_result_whole(
        queue: Queue) -> None:
    spec = synthetic()
    jobs, claim = admit_and_claim(queue, spec, 3, 2)
    assert [(r or {}).get("status") for r in queue.read_records(jobs)] == [
        "running", "running", "queued"]
    long = {"values": list(range(2000))}  # about 9 KB: past read.lua's first 4 KiB
    queue.complete(spec, claim, [Outcome(jobs[0], result=long),
                                 Outcome(jobs[1], result={"ok": 1})],
                   {"size": 2, "bin": spec.bins[0].name, "worker": "w"})
    first, second, third = queue.get_many(jobs)
    assert first is not None and first.result == long
    assert second is not None and second.status is JobStatus.DONE
    assert third is not None and third.status is JobStatus.QUEUED


def test_an_outcome_without_its_claims_admission_fields_is_refused_and_reaped_later(
        queue: Queue) -> None:
    spec = synthetic()
    jobs, claim = admit_and_claim(queue, spec, 2, 2)
    blank = replace(claim, jobs=(claim.jobs[0], replace(claim.jobs[1], admission="")))
    written = queue.complete(spec, blank, [Outcome(j, result={}) for j in jobs],
                             {"size": 2, "bin": spec.bins[0].name, "worker": "w"}).written
    assert written == [True, False]
    held = queue.client.hkeys(queue.keys.claim(shard_of_job(jobs[1]), "t"))
    assert jobs[1] in held  # still the claim's: its lease lapses and the reaper returns it
    assert (queue.read_records([jobs[1]])[0] or {}).get("status") == "running"
    with pytest.raises(ValueError, match="does not hold"):
        queue.complete(spec, blank, [Outcome("someone-else", result={})], {"size": 1})


def test_an_empty_error_reads_as_empty_as_its_pushed_view_says() -> None:
    failed = records.build({"status": "failed", "attempts": "1", "t_done": "9", "error": ""})
    assert records.parse(failed)["error"] == ""


def test_reads_across_shards_go_in_one_pipeline_and_survive_a_script_flush(
        queue: Queue) -> None:
    catalogue = load_catalogue(None)
    specs = [catalogue.get("synthetic"), catalogue.get("minilm")]
    assert shard_of_job(new_job_id(specs[0].name)) != shard_of_job(new_job_id(specs[1].name))
    jobs = [new_job_id(s.name) for s in specs]
    for s, job in zip(specs, jobs, strict=True):
        single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
            s, (AdmitJob(s.bins[0], job, '{"text": "x"}'),), queued_ttl_s=TTL_S)))
    queue.client.script_flush()  # as after a Redis restart: the pipeline must load it again
    assert [(r or {}).get("model") for r in queue.read_records([*jobs, "gone" + jobs[0]])] == [
        "synthetic", "minilm", None]
