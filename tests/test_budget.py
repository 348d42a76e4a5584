"""The byte budget in admit.lua, claim.lua and cancel.lua, on a real redis-server."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import redis

from carpool.budget import LIVE_BUCKETS, bucket_ms, memory_report
from carpool.catalogue import ModelSpec, load_catalogue
from carpool.errors import BudgetFull
from carpool.jobs import new_job_id
from carpool.queue import AdmitRequest, Queue

TTL_S = 60
#: One input's stored JSON: {"size":1,"value":"xxx..."} with this many x's.
VALUE_CHARS = 1000
BUDGET_BYTES = 10 * VALUE_CHARS


def spec(per_key: int = 0) -> ModelSpec:
    return replace(load_catalogue(None).get("synthetic"), max_queued_bytes=BUDGET_BYTES,
                   max_queued_bytes_per_key=per_key)


def admit(q: Queue, s: ModelSpec, owner: str = "") -> str:
    body = json.dumps({"value": "x" * VALUE_CHARS, "size": 1})
    return q.admit(s, s.bin_for(1), new_job_id(s.name), body, queued_ttl_s=TTL_S, owner=owner).id


def fill(q: Queue, s: ModelSpec, owner: str = "") -> list[str]:
    ids = []
    with pytest.raises(BudgetFull):
        while True:
            ids.append(admit(q, s, owner))
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
    jobs = [(s.bin_for(1), new_job_id(s.name), body) for _ in range(fits + 3)]
    outcomes = queue.admit_many(s, jobs, AdmitRequest(TTL_S))
    assert [type(o).__name__ for o in outcomes] == ["Admitted"] * fits + ["BudgetFull"] * 3
    held = sum(int(v) for f, v in client.hgetall(queue.keys.queued_bytes(s.name)).items()
               if f != "w")
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


def test_buckets_older_than_the_record_ttl_no_longer_count(queue: Queue,
                                                         client: redis.Redis) -> None:
    s = spec()
    fill(queue, s)
    key = queue.keys.queued_bytes(s.name)
    width = bucket_ms(TTL_S)
    (bucket,) = [f for f in client.hkeys(key) if f != "w"]
    # As if those records were admitted LIVE_BUCKETS + 1 buckets ago (they have expired).
    client.hset(key, str(int(bucket) - LIVE_BUCKETS - 1), client.hget(key, bucket) or 0)
    client.hdel(key, bucket)
    assert int(client.hget(key, "w") or 0) == width
    admit(queue, s)
    assert [f for f in client.hkeys(key) if f != "w"] == [bucket]


def test_the_shipped_catalogue_fits_the_shipped_maxmemory_with_room_for_results() -> None:
    fits, text = memory_report(load_catalogue(None), 2 << 30)
    assert fits, text
    assert not memory_report(load_catalogue(None), 64 << 20)[0]
