"""The order of a claim (claim.lua, peek.lua, admit.lua's scores) on a real redis-server:
earliest deadline first, then priority, equal ones in admission order; expired jobs give
their places up; the score a job keeps."""

from __future__ import annotations

import json
from dataclasses import replace

from carpool.backend import records
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec
from carpool.core.jobs import JobStatus
from tests.support.jobs import admit, synthetic


def claimed_values(q: Queue, spec: ModelSpec, n: int = 100) -> list[object]:
    claim = q.claim(spec, "small", n, lease_ms=5000, token="t", worker="w")
    return [json.loads(j.input_json)["value"] for j in claim.jobs]


def test_claim_takes_the_earliest_deadline_first_and_equal_deadlines_in_order(
        queue: Queue) -> None:
    spec = synthetic()
    for value, deadline in (("d9", 9000), ("d3a", 3000), ("none", 0), ("d5", 5000),
                            ("d3b", 3000)):
        admit(queue, spec, value=value, deadline_ms=deadline)
    assert claimed_values(queue, spec) == ["d3a", "d3b", "d5", "d9", "none"]


def test_a_higher_priority_is_claimed_before_a_lower_one(queue: Queue) -> None:
    spec = synthetic()
    for value, priority in (("p0a", 0), ("p0b", 0), ("p9", 9), ("p1", 1)):
        admit(queue, spec, value=value, priority=priority)
    assert claimed_values(queue, spec, 2) == ["p9", "p1"]
    assert claimed_values(queue, spec) == ["p0a", "p0b"]


def test_expired_jobs_give_their_places_in_a_claim_to_the_next_jobs(queue: Queue) -> None:
    spec = synthetic()
    dead = [admit(queue, spec, value=f"dead{i}", deadline_ms=1) for i in range(3)]
    for job in dead:
        records.update(queue.client, queue.keys.job(job), deadline=1)  # long past, Redis's clock
    admit(queue, spec, value="live1")
    admit(queue, spec, value="live2")
    claim = queue.claim(spec, "small", 2, lease_ms=5000, token="t", worker="w")
    assert [json.loads(j.input_json)["value"] for j in claim.jobs] == ["live1", "live2"]
    assert claim.expired == 3  # counted once, by the claim that ended them
    assert all(queue.get(j).status is JobStatus.EXPIRED for j in dead)  # type: ignore[union-attr]
    assert queue.get(dead[0]).error == "deadline passed while queued"  # type: ignore[union-attr]


def test_peek_reports_the_earliest_deadline_and_oldest_admission_of_the_next_batch(
        queue: Queue) -> None:
    spec = synthetic()
    oldest = admit(queue, spec, value="old")
    urgent = admit(queue, spec, value="urgent", deadline_ms=5000)
    # A bin below its max_batch (3 here) has every job looked at; a full one only its head.
    _, (small,) = queue.peek([("synthetic", "small")], scan=[3])
    record = records.read(queue.client, queue.keys.job(urgent)) or {}
    assert small.depth == 2 and small.admitted == 2
    assert small.earliest_deadline_ms == int(record["deadline"])
    assert small.oldest_admit_ms == int((records.read(queue.client, queue.keys.job(oldest))
                                         or {})["t_admit"])
    _, (head_only,) = queue.peek([("synthetic", "small")], scan=[1])
    assert head_only.oldest_admit_ms == int(record["t_admit"])  # the urgent job sorts first


def test_a_new_most_urgent_job_wakes_a_worker(queue: Queue) -> None:
    spec = synthetic()
    wake = queue.keys.wake("synthetic")
    admit(queue, spec)
    admit(queue, spec)
    assert queue.client.llen(wake) == 1
    admit(queue, spec, deadline_ms=1000)  # overtakes the head: a new, earlier deadline
    assert queue.client.llen(wake) == 2


def test_a_job_keeps_its_score_so_it_can_return_to_its_place(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec, deadline_ms=2000, priority=3)
    record = records.read(queue.client, queue.keys.job(job)) or {}
    score = queue.client.zscore(queue.keys.bin("synthetic", "small"), job)
    assert float(record["score"]) == score
    admitted_us = int(record["t_admit"]) * 1000
    assert admitted_us <= score - (2000 - 3 * spec.priority_step_ms) * 1000 < admitted_us + 1000


def test_admission_applies_the_models_default_deadline(queue: Queue) -> None:
    spec = replace(synthetic(), default_deadline_ms=7000)
    job = admit(queue, spec)
    record = records.read(queue.client, queue.keys.job(job)) or {}
    assert int(record["deadline"]) == int(record["t_admit"]) + 7000
