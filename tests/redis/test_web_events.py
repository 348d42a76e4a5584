"""Event streams and the job document on real Redis through the Flask app: claim notices
(claim.lua's PUBLISH), a running job's start time, a stream woken by a claim and an end."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec
from carpool.core.jobs import Claim, Outcome
from tests.support.procs import wait_until
from tests.support.webtools import app_state, web_client, web_settings

BOUND_S = 10.0


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def submit(http: FlaskClient) -> str:
    resp = http.post("/submit", json={"model": "synthetic", "input": {"value": 1, "size": 3}})
    assert resp.status_code == 202
    return str(resp.get_json()["id"])


def claim_all(http: FlaskClient, queue: Queue) -> tuple[ModelSpec, Claim]:
    spec = app_state(http).settings.catalogue.get("synthetic")
    return spec, queue.claim(spec, "small", 1000, lease_ms=30_000, token=uuid.uuid4().hex,
                             worker="w")


def test_a_claim_publishes_its_jobs_with_its_time_and_attempts(
        http: FlaskClient, queue: Queue, client: redis.Redis) -> None:
    pubsub = client.pubsub()
    pubsub.subscribe(queue.keys.claimed_channel)
    jobs = [submit(http), submit(http)]
    heard: list[str] = []

    def hear() -> bool:
        message = pubsub.get_message(timeout=0.1)
        if message is not None and message["type"] == "message":
            heard.append(str(message["data"]))
        return bool(heard)

    wait_until(lambda: pubsub.get_message(timeout=0.1) is not None, BOUND_S, "subscribed")
    _, claim = claim_all(http, queue)
    wait_until(hear, BOUND_S, "the claim notice")
    t_ms, *rest = heard[0].split()
    assert int(t_ms) == claim.now_ms and rest == [jobs[0], "1", jobs[1], "1"]
    pubsub.close()


def test_a_running_job_shows_its_claims_start_and_attempts(
        http: FlaskClient, queue: Queue) -> None:
    job = submit(http)
    assert http.get(f"/result/{job}").get_json()["attempts"] == 0
    state = app_state(http)
    wait_until(state.notifier.listening, BOUND_S, "the listener")
    spec, claim = claim_all(http, queue)
    wait_until(lambda: state.notifier.claim_of(job) is not None, BOUND_S, "the claim heard")
    doc = http.get(f"/result/{job}").get_json()
    assert doc["status"] == "running" and doc["attempts"] == 1
    assert "queue_position" not in doc and doc["started_at"].endswith("Z")
    queue.complete(spec, claim, [Outcome(job, result={"ok": 1})], {"size": 1, "bin": "small",
                                                                  "worker": "w"})
    final = http.get(f"/result/{job}?wait=5").get_json()
    assert final["status"] == "done" and final["started_at"] == doc["started_at"]
    assert final["attempts"] == 1 and final["completed_at"] >= final["started_at"]


def test_a_stream_is_woken_by_the_claim_and_the_end_of_its_job(
        http: FlaskClient, queue: Queue) -> None:
    job = submit(http)
    state = app_state(http)
    wait_until(state.notifier.listening, BOUND_S, "the listener")
    resp = http.get(f"/result/{job}/events", buffered=False)
    chunks = iter(resp.response)
    assert b"event: queued" in next(chunks)
    spec, claim = claim_all(http, queue)
    running = next(chunks)
    assert b"event: running" in running and b"id: 1" in running
    queue.complete(spec, claim, [Outcome(job, result={"ok": 1})], {"size": 1, "bin": "small",
                                                                  "worker": "w"})
    done = next(chunks).decode()
    assert "event: done" in done and "id: y" in done  # y: any final state
    assert json.loads(done.split("data: ", 1)[1])["result"] == {"ok": 1}
    resp.close()
    assert state.notifier._current().followers.following(job) == 0  # forgotten at the end


def test_a_job_handed_back_seventeen_times_is_told_running_then_done(
        http: FlaskClient, queue: Queue) -> None:
    """Each hand-back counts its run (a batch that ended without its results written),
    so a job may run past CARPOOL_MAX_ATTEMPTS: its queued, running and done states once
    saturated the id's character, and neither running nor done was told."""
    job = submit(http)
    state = app_state(http)
    leases = Leases(queue.client, queue.keys, state.settings.catalogue)
    for _ in range(17):
        _, claim = claim_all(http, queue)
        assert leases.release(claim.token, [job], refund_attempt=False) == [True]
    wait_until(state.notifier.listening, BOUND_S, "the listener")
    resp = http.get(f"/result/{job}/events", buffered=False)
    chunks = iter(resp.response)
    assert b"event: queued" in next(chunks)
    spec, claim = claim_all(http, queue)
    assert b"event: running" in next(chunks)
    queue.complete(spec, claim, [Outcome(job, result={"ok": 1})], {"size": 1})
    done = next(chunks).decode()
    assert "event: done" in done and json.loads(done.split("data: ", 1)[1])["attempts"] == 18
    resp.close()


def test_a_resumed_stream_goes_on_without_a_job_gone_since_the_client_saw_it(
        http: FlaskClient, queue: Queue) -> None:
    """Gone (its result deleted, or expired) after the client was told of it: the stream
    resumes with the others, as when a job goes mid-stream; an id never seen stays 404."""
    gone = submit(http)
    spec, claim = claim_all(http, queue)
    queue.complete(spec, claim, [Outcome(gone, result={"ok": 1})], {"size": 1})
    waiting = submit(http)  # queued: the stream follows it
    first = http.get(f"/events?ids={gone},{waiting}", buffered=False)
    start = next(iter(first.response)).decode()
    first.close()
    last_id = [line for line in start.splitlines() if line.startswith("id: ")][-1][4:]
    assert len(last_id) == 2 and "event: done" in start
    assert http.delete(f"/result/{gone}").status_code == 200
    resumed = http.get(f"/events?ids={gone},{waiting}", buffered=False,
                       headers={"Last-Event-ID": last_id})
    assert resumed.status_code == 200
    resumed.close()
    fresh = http.get(f"/events?ids={gone},{waiting}")
    assert fresh.status_code == 404  # never seen by this client: unknown
