"""The byte budget in admit.lua, claim.lua and cancel.lua, on a real redis-server."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import redis

from carpool.admission.budget import FINISHED_RECORD_BYTES, RECORD_OVERHEAD_BYTES, memory_report
from carpool.backend import records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest
from carpool.backend.keys import Keys
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.errors import BudgetFull
from carpool.core.jobs import JobStatus, Outcome, new_job_id
from tests.support.jobs import admit
from tests.support.redisproc import private_redis

TTL_S = 60
#: One input's stored JSON: {"size":1,"value":"xxx..."} with this many x's.
VALUE_CHARS = 1000
VALUE = "x" * VALUE_CHARS
BUDGET_BYTES = 10 * VALUE_CHARS


def spec(per_key: int = 0) -> ModelSpec:
    return replace(load_catalogue(None).get("synthetic"), max_queued_bytes=BUDGET_BYTES,
                   max_queued_bytes_per_key=per_key)


def fill(q: Queue, s: ModelSpec, owner: str = "") -> list[str]:
    ids = []
    with pytest.raises(BudgetFull):
        while True:
            ids.append(admit(q, s, value=VALUE, owner=owner))
    return ids


def test_admission_stops_at_the_byte_budget_and_a_claim_frees_what_it_took(
        queue: Queue) -> None:
    s = spec()
    ids = fill(queue, s)
    assert len(ids) == BUDGET_BYTES // (VALUE_CHARS + 24)  # the JSON around each value
    claim = queue.claim(s, "small", 3, lease_ms=10_000, token="t", worker="w")
    assert len(claim.jobs) == 3
    assert len(fill(queue, s)) == 3


def test_one_call_of_many_jobs_stops_at_the_first_input_over_the_budget(
        queue: Queue, client: redis.Redis) -> None:
    s = spec()
    body = json.dumps({"value": "x" * VALUE_CHARS, "size": 1})
    fits = BUDGET_BYTES // len(body)
    jobs = tuple(AdmitJob(s.bin_for(1), new_job_id(s.name), body) for _ in range(fits + 3))
    outcomes = Admissions(queue.client, queue.keys).admit(AdmitRequest(s, jobs, TTL_S))
    assert [type(o).__name__ for o in outcomes] == ["Admitted"] * fits + ["BudgetFull"] * 3
    held = int(client.hget(queue.keys.queued_bytes(s.name), "queued") or 0)
    assert held == fits * len(body)  # the refused jobs were not counted
    assert queue.depths([(s.name, "small")]) == [fits]


def test_a_cancelled_job_frees_its_bytes(queue: Queue) -> None:
    s = spec()
    ids = fill(queue, s)
    assert queue.cancel(ids[0], TTL_S) == "cancelled"
    assert len(fill(queue, s)) == 1


def test_one_api_key_cannot_take_the_whole_model(queue: Queue) -> None:
    s = spec()  # per key: half the model's budget
    first = fill(queue, s, owner="a" * 64)
    assert len(first) == (BUDGET_BYTES // 2) // (VALUE_CHARS + 24)
    assert len(fill(queue, s, owner="b" * 64)) == len(first)


def test_inputs_queued_past_the_ttl_still_count_until_their_claim_ends_them(
        queue: Queue, client: redis.Redis) -> None:
    s = spec()
    ids = fill(queue, s)
    for job_id in ids:  # as if admitted TTL_S + 1 s ago, on Redis's clock
        key = queue.keys.job(job_id)
        assert client.ttl(key) == -1  # a queued record never expires: its bytes are there
        t_admit = int((records.read(client, key) or {}).get("t_admit", 0))
        records.update(client, key, t_admit=t_admit - (TTL_S + 1) * 1000)
    with pytest.raises(BudgetFull):
        admit(queue, s, value=VALUE)
    claim = queue.claim(s, "small", len(ids), lease_ms=10_000, token="t", worker="w",
                        queued_ttl_s=TTL_S)
    assert (claim.jobs, claim.expired) == ((), len(ids))
    assert all(queue.get(j).status is JobStatus.EXPIRED for j in ids)  # type: ignore[union-attr]
    assert not client.exists(queue.keys.queued_bytes(s.name))  # it goes with its last byte
    assert len(fill(queue, s)) == len(ids)


def test_a_requeued_input_never_takes_the_count_below_zero(
        queue: Queue, client: redis.Redis) -> None:
    s = spec()
    leases = Leases(client, queue.keys, load_catalogue(None))
    first = admit(queue, s, value=VALUE)
    queue.claim(s, "small", 1, lease_ms=10_000, token="a", worker="w")
    leases.release("a", [first], refund_attempt=True)  # back in its bin, not counted again
    admit(queue, s, value=VALUE)
    claim = queue.claim(s, "small", 2, lease_ms=10_000, token="b", worker="w")
    assert len(claim.jobs) == 2  # two inputs out of a count of one: 0, not below
    assert not client.exists(queue.keys.queued_bytes(s.name))
    assert len(fill(queue, s)) == BUDGET_BYTES // (VALUE_CHARS + 24)


def test_the_shipped_catalogue_fits_the_shipped_maxmemory_with_room_for_results() -> None:
    fits, text = memory_report(load_catalogue(None), 2 << 30)
    assert fits, text
    assert not memory_report(load_catalogue(None), 64 << 20)[0]


def test_the_memory_arithmetic_bounds_what_records_take_in_a_real_redis() -> None:
    """RECORD_OVERHEAD_BYTES and FINISHED_RECORD_BYTES, which the web's startup check
    counts with, are upper bounds of what Redis spends per synthetic job (its own
    used_memory, on a private Redis so nothing else moves it)."""
    s = load_catalogue(None).get("synthetic")
    body = json.dumps({"value": 12345, "size": 8})
    jobs = 40 * 64
    with private_redis() as server, server.client() as client:
        q = Queue(client, Keys("mem"))
        before = int(client.info("memory")["used_memory"])
        admissions = Admissions(q.client, q.keys)
        for _ in range(jobs // 64):
            admissions.admit(AdmitRequest(s, tuple(
                AdmitJob(s.bins[0], new_job_id(s.name), body) for _ in range(64)), TTL_S))
        queued = int(client.info("memory")["used_memory"])
        for k in range(jobs // 32):
            c = q.claim(s, s.bins[0].name, 32, lease_ms=60_000, token=f"t{k}", worker="w0@host")
            q.complete(s, c, [Outcome(j.id, result={"echo": 12345, "checksum": "0" * 16})
                              for j in c.jobs], {"size": 32, "bin": "small", "worker": "w0@host"})
        finished = int(client.info("memory")["used_memory"])
    assert 0 < (queued - before) / jobs - len(body) <= RECORD_OVERHEAD_BYTES
    assert 0 < (finished - before) / jobs <= FINISHED_RECORD_BYTES
