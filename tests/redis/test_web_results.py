"""GET and DELETE /result/<id> on real Redis, including long-polls woken by completion."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.jobs import Outcome, new_job_id
from tests.support.procs import free_port, wait_until
from tests.support.webtools import app_state, web_client, web_settings

#: A poll woken by its job's completion returns far sooner than this, however busy the
#: machine; one that is not woken sits out its whole wait (POLL_WAIT_S).
WOKEN_WITHIN_S = 10.0
POLL_WAIT_S = 30


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def submit(http: FlaskClient, size: int = 3) -> str:
    resp = http.post("/submit", json={"model": "synthetic", "input": {"value": 1, "size": size}})
    assert resp.status_code == 202
    return str(resp.get_json()["id"])


def run_queued_jobs(http: FlaskClient, queue: Queue, *, fail: bool = False) -> list[str]:
    """Claim and complete every job of the synthetic model's small bin, as a worker would."""
    spec = app_state(http).settings.catalogue.get("synthetic")
    claim = queue.claim(spec, "small", 1000, lease_ms=30_000, token=uuid.uuid4().hex,
                        worker="test-worker")
    outcomes = [Outcome(j.id, error="boom") if fail else Outcome(j.id, result={"echo": 1})
                for j in claim.jobs]
    queue.complete(spec, claim, outcomes, {"size": len(outcomes), "bin": "small",
                                           "worker": "test-worker"})
    return [j.id for j in claim.jobs]


def test_a_completion_whose_result_json_cannot_carry_fails_that_job_alone(
        http: FlaskClient, queue: Queue) -> None:
    """Outcomes the runner did not encode (it fails such a job itself) are checked again
    as the completion is written: never a record that is not JSON, never a completion
    that raises (its batch would stay claimed, and run again, for nothing)."""
    overflowed, fine = submit(http), submit(http)
    spec = app_state(http).settings.catalogue.get("synthetic")
    claim = queue.claim(spec, "small", 10, lease_ms=30_000, token=uuid.uuid4().hex,
                        worker="test-worker")
    queue.complete(spec, claim, [Outcome(overflowed, result={"score": float("nan")}),
                                 Outcome(fine, result={"score": 1.5})], {"size": 2})
    failed = json.loads(http.get(f"/result/{overflowed}").get_data(),
                        parse_constant=lambda name: pytest.fail(f"{name} in the answer"))
    assert failed["status"] == "failed" and "NaN or Infinity" in failed["error"]
    assert http.get(f"/result/{fine}").get_json()["result"] == {"score": 1.5}


def test_queued_job_reads_as_queued_with_its_place_time_and_links(http: FlaskClient) -> None:
    first, job_id = submit(http), submit(http)
    doc = http.get(f"/result/{job_id}").get_json()
    assert doc.pop("waiting_for")["state"] == "no worker"  # no worker is live in this test
    created = doc.pop("created_at")
    assert created.endswith("Z") and created[:4].isdigit()  # RFC 3339, UTC
    assert doc == {"id": job_id, "model": "synthetic", "model_version": "1", "status": "queued",
                   "attempts": 0,
                   "queue_position": 1, "urls": {"result": f"/result/{job_id}",
                                                 "cancel": f"/result/{job_id}",
                                                 "events": f"/result/{job_id}/events"}}
    assert http.get(f"/result/{first}").get_json()["queue_position"] == 0


def test_done_job_shows_its_result_timings_and_batch(http: FlaskClient, queue: Queue) -> None:
    job_id = submit(http)
    run_queued_jobs(http, queue)
    body = http.get(f"/result/{job_id}").get_json()
    assert body["status"] == "done"
    assert body["result"] == {"echo": 1}
    assert set(body["timings_ms"]) == {"queue", "preprocess", "inference", "total"}
    assert body["batch"] == {"size": 1, "bin": "small", "worker": "test-worker"}


def test_failed_job_shows_its_error(http: FlaskClient, queue: Queue) -> None:
    job_id = submit(http)
    run_queued_jobs(http, queue, fail=True)
    body = http.get(f"/result/{job_id}").get_json()
    assert (body["status"], body["error"]) == ("failed", "boom")


def test_unknown_job_id_answers_404(http: FlaskClient) -> None:
    resp = http.get(f"/result/{new_job_id('synthetic')}")
    assert resp.status_code == 404
    assert resp.get_json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("bad_id", ["short", "x" * 23, "a" * 21 + "!", "a" * 21 + "%C3%A9"])
def test_malformed_job_id_answers_404_without_asking_redis(
    redis_url: str, key_prefix: str, tmp_path: Path, bad_id: str
) -> None:
    # Redis is unreachable here: a lookup would answer 503, so 404 shows there was none.
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with web_client(web_settings(closed, key_prefix, tmp_path)) as http:
        assert http.get(f"/result/{bad_id}").status_code == 404
        assert http.delete(f"/result/{bad_id}").status_code == 404


@pytest.mark.parametrize("wait", ["-1", "abc", "nan", "inf", "61", ""])
def test_wait_outside_zero_to_max_wait_answers_400(http: FlaskClient, wait: str) -> None:
    resp = http.get(f"/result/{submit(http)}?wait={wait}")
    assert resp.status_code == 400


def test_long_poll_returns_as_soon_as_its_job_completes(
    http: FlaskClient, queue: Queue, client: redis.Redis, keys: Keys
) -> None:
    job_id = submit(http)
    notifier = app_state(http).notifier

    def ready() -> bool:
        return (notifier.watching(job_id) == 1
                and client.pubsub_numsub(keys.done_channel)[0][1] >= 1)

    resp, elapsed = _poll_while_completing(http, queue, job_id, ready)
    assert resp.get_json()["status"] == "done"
    assert elapsed < WOKEN_WITHIN_S
    assert notifier.watching(job_id) == 0  # the poll unregistered itself


def test_long_poll_that_times_out_answers_the_job_as_it_is(http: FlaskClient) -> None:
    job_id = submit(http)
    started = time.monotonic()
    resp = http.get(f"/result/{job_id}?wait=0.3")
    assert time.monotonic() - started >= 0.3
    assert (resp.status_code, resp.get_json()["status"]) == (200, "queued")


def test_long_poll_on_a_final_job_returns_at_once(http: FlaskClient, queue: Queue) -> None:
    job_id = submit(http)
    run_queued_jobs(http, queue)
    started = time.monotonic()
    assert http.get(f"/result/{job_id}?wait=30").get_json()["status"] == "done"
    assert time.monotonic() - started < WOKEN_WITHIN_S


def test_delete_cancels_a_queued_job_and_removes_it_from_its_bin(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    job_id, other = submit(http), submit(http)
    resp = http.delete(f"/result/{job_id}")
    assert (resp.status_code, resp.get_json()) == (200, {"id": job_id, "status": "cancelled"})
    assert client.zrange(keys.bin("synthetic", "small"), 0, -1) == [other]
    assert http.get(f"/result/{job_id}").get_json()["status"] == "cancelled"


def test_delete_removes_a_finished_result(http: FlaskClient, queue: Queue) -> None:
    job_id = submit(http)
    run_queued_jobs(http, queue)
    resp = http.delete(f"/result/{job_id}")
    assert (resp.status_code, resp.get_json()) == (200, {"id": job_id, "deleted": True})
    assert http.get(f"/result/{job_id}").status_code == 404


def test_delete_of_a_running_job_answers_409(http: FlaskClient, queue: Queue) -> None:
    job_id = submit(http)
    spec = app_state(http).settings.catalogue.get("synthetic")
    queue.claim(spec, "small", 10, lease_ms=30_000, token="t", worker="w")
    resp = http.delete(f"/result/{job_id}")
    assert resp.status_code == 409
    assert resp.get_json()["error"]["code"] == "not_cancellable"


def test_delete_of_an_unknown_job_answers_404(http: FlaskClient) -> None:
    assert http.delete(f"/result/{new_job_id('synthetic')}").status_code == 404


def _listening(http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    """Starts the app's listener and waits for its subscription to all its channels."""
    wait_until(app_state(http).notifier.listening, 5.0, "the listener's subscription")


def test_a_poll_on_a_job_this_process_saw_admitted_never_reads_it(
    http: FlaskClient, queue: Queue, client: redis.Redis, keys: Keys
) -> None:
    _listening(http, client, keys)
    state = app_state(http)
    job_id = submit(http)
    wait_until(lambda: state.notifier.pending() == 1, 5.0, "the admission notice")
    reads_before = state.reads.calls.round_trips
    reads_while_waiting: list[int] = []

    def ready() -> bool:
        if state.notifier.watching(job_id) != 1:
            return False
        reads_while_waiting.append(state.reads.calls.round_trips - reads_before)
        return True

    resp, elapsed = _poll_while_completing(http, queue, job_id, ready)
    assert resp.get_json()["status"] == "done" and elapsed < WOKEN_WITHIN_S
    assert reads_while_waiting == [0]  # no read before the end notice...
    # ...and none after it either: the completion pushed its view (carpool/backend/pushed.py).
    assert state.reads.calls.round_trips - reads_before == 0
    assert state.notifier.pending() == 0  # the end notice took it out


def test_a_pending_job_whose_wait_ends_answers_as_it_is_not_404(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    _listening(http, client, keys)
    job_id = submit(http)
    wait_until(lambda: app_state(http).notifier.pending() == 1, 5.0, "the admission notice")
    resp = http.get(f"/result/{job_id}?wait=0.3")
    assert (resp.status_code, resp.get_json()["status"]) == (200, "queued")


def test_a_poll_on_a_job_admitted_before_the_listener_reads_first(
    http: FlaskClient, queue: Queue, client: redis.Redis, keys: Keys
) -> None:
    job_id = submit(http)  # no listener yet: its admission notice reaches no one here
    _listening(http, client, keys)
    state = app_state(http)
    assert state.notifier.pending() == 0
    reads_before = state.reads.calls.round_trips
    read_first: list[int] = []

    def read_then_waiting() -> bool:  # unknown here: it reads first (and finds it queued)
        # ``round_trips`` counts a read as it starts: the job must end after the read.
        reads = state.reads.calls
        if (state.notifier.watching(job_id) != 1 or reads.round_trips == reads_before
                or reads.in_flight()):
            return False
        read_first.append(state.reads.calls.round_trips)
        return True

    resp, elapsed = _poll_while_completing(http, queue, job_id, read_then_waiting)
    assert resp.get_json()["status"] == "done" and elapsed < WOKEN_WITHIN_S
    # Woken by the pushed view (published before the done ids): no read after the first.
    assert state.reads.calls.round_trips == read_first[0]


def test_a_get_right_after_delete_is_a_404_even_with_the_result_pushed_here(
    http: FlaskClient, queue: Queue, client: redis.Redis, keys: Keys
) -> None:
    _listening(http, client, keys)
    state = app_state(http)
    job_id = submit(http)
    run_queued_jobs(http, queue)
    wait_until(lambda: state.notifier.pushed_view(job_id) is not None, 5.0, "the push")
    assert http.delete(f"/result/{job_id}").status_code == 200
    assert http.get(f"/result/{job_id}").status_code == 404  # not the pushed view


def _poll_while_completing(http: FlaskClient, queue: Queue, job_id: str,
                           ready: Callable[[], bool]) -> tuple[TestResponse, float]:
    """Long-poll ``job_id`` while another thread, once ``ready()``, runs the queued
    jobs as a worker would; the answer and how long the poll took (s)."""
    def complete_once_ready() -> None:
        wait_until(ready, 5.0, "the poll to wait")
        run_queued_jobs(http, queue)

    worker = threading.Thread(target=complete_once_ready)
    worker.start()
    started = time.monotonic()
    resp = http.get(f"/result/{job_id}?wait={POLL_WAIT_S}")
    elapsed = time.monotonic() - started
    worker.join(10)
    return resp, elapsed
