"""A job's record: what the Lua scripts write is what ``carpool.records`` reads, field by
field, through a job's whole life on a real Redis."""

from __future__ import annotations

import json
import re
from importlib.resources import files

from carpool import records
from carpool.catalogue import ModelSpec, load_catalogue
from carpool.jobs import Outcome, new_job_id
from carpool.queue import Queue

TTL_S = 3600


def synthetic() -> ModelSpec:
    return load_catalogue(None).get("synthetic")


def test_the_lua_side_names_the_same_fields_in_the_same_order() -> None:
    source = files("carpool").joinpath("lua", "record.lua").read_text()
    head = re.search(r'fields, "([a-z_ ]+\n-- [a-z_ ]+)", and once ended "([a-z_ ]+)"', source)
    assert head is not None, "record.lua's comment no longer lists the fields"
    assert tuple(head.group(1).replace("\n-- ", " ").split()) == records.HEAD
    assert tuple(head.group(2).split()) == records.ENDED


def test_an_admitted_record_holds_every_option_and_no_input(queue: Queue) -> None:
    spec = synthetic()
    job = new_job_id(spec.name)
    body = json.dumps({"value": "a\tb\nc", "size": 1})  # the input may hold anything
    queue.admit(spec, spec.bins[0], job, body, queued_ttl_s=TTL_S, deadline_ms=5000,
                priority=3, idempotency_digest="k" * 16, input_digest="d" * 16,
                owner="o" * 16)
    record = records.read(queue.client, queue.keys.job(job))
    assert record is not None
    assert record["status"] == "queued" and "attempts" not in record  # never claimed
    assert (record["model"], record["bin"]) == (spec.name, spec.bins[0].name)
    assert int(record["deadline"]) == int(record["t_admit"]) + 5000
    assert (record["priority"], record["owner"], record["digest"]) == ("3", "o" * 16, "d" * 16)
    assert record["idem"] == queue.keys.idempotency(spec.name, "k" * 16)
    score = queue.client.zscore(queue.keys.bin(spec.name, spec.bins[0].name), job)
    assert float(record["score"]) == score
    assert record["input"] == body
    read = queue._records([job])[0] or ""  # what GET /result reads: never the input
    assert records.parse(read) == {k: v for k, v in record.items() if k != "input"}


def test_a_done_record_keeps_its_admission_and_adds_its_end(queue: Queue) -> None:
    spec = synthetic()
    job = new_job_id(spec.name)
    queue.admit(spec, spec.bins[0], job, '{"value": 1, "size": 1}', queued_ttl_s=TTL_S,
                priority=2, owner="o" * 16)
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
    assert json.loads(done["timings"]) == {"preprocess": 1.5, "inference": 2.0}
    assert json.loads(done["batch"])["worker"] == "w9"
    assert json.loads(done["result"]) == {"multi\nline": "x\ty"}
    assert 0 < queue.client.ttl(queue.keys.job(job)) <= spec.result_ttl_s
    assert "input" not in done and '"value"' not in (queue.client.get(queue.keys.job(job)) or "")


def test_a_failed_and_a_cancelled_record_carry_their_error(queue: Queue) -> None:
    spec = synthetic()
    bad, dropped = new_job_id(spec.name), new_job_id(spec.name)
    for job in (bad, dropped):
        queue.admit(spec, spec.bins[0], job, '{"value": 1, "size": 1}', queued_ttl_s=TTL_S)
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
