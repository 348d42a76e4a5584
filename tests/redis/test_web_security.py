"""API keys: who may submit, and who may read or cancel which job (Flask app, real Redis)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.errors import ConfigError
from carpool.core.settings import api_key_digest, load_settings
from tests.conftest import make_env
from tests.redis.test_web_results import run_queued_jobs
from tests.support.procs import wait_until
from tests.support.webtools import app_state, web_client, web_settings

ALICE = "alice-key-0123456789abcdef01"
BOB = "bob-key-0123456789abcdef0123"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    settings = web_settings(redis_url, key_prefix, tmp_path,
                            CARPOOL_API_KEYS=f"{ALICE}, {BOB}")
    with web_client(settings) as c:
        yield c


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def job(value: Any = 1, **extra: Any) -> dict[str, Any]:
    return {"model": "synthetic", "input": {"value": value, "size": 1}, **extra}


def test_submit_without_a_key_answers_401_with_a_bearer_challenge(http: FlaskClient) -> None:
    resp = http.post("/submit", json=job())
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert resp.get_json()["error"]["code"] == "unauthorized"


def test_an_unknown_key_answers_401(http: FlaskClient) -> None:
    assert http.post("/submit", json=job(), headers=as_("x" * 30)).status_code == 401
    assert http.post("/submit/batch", json={"model": "synthetic", "inputs": [{"value": 1,
                     "size": 1}]}, headers=as_("x" * 30)).status_code == 401


def test_the_owner_reads_and_cancels_its_job_others_get_404_as_for_an_unknown_id(
        http: FlaskClient) -> None:
    job_id = http.post("/submit", json=job(), headers=as_(ALICE)).get_json()["id"]
    assert http.get(f"/result/{job_id}", headers=as_(ALICE)).status_code == 200
    assert http.get(f"/result/{job_id}", headers={"X-API-Key": ALICE}).status_code == 200
    unknown = http.get(f"/result/{'A' * 22}", headers=as_(BOB))
    other = http.get(f"/result/{job_id}?wait=5", headers=as_(BOB))
    assert other.status_code == unknown.status_code == 404
    assert other.get_json()["error"]["code"] == unknown.get_json()["error"]["code"]
    assert http.delete(f"/result/{job_id}", headers=as_(BOB)).status_code == 404
    assert http.get(f"/result/{job_id}").status_code == 401
    assert http.delete(f"/result/{job_id}", headers=as_(ALICE)).get_json()["status"] == "cancelled"


def test_the_job_records_only_a_digest_of_its_key(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    job_id = http.post("/submit", json=job(), headers=as_(ALICE)).get_json()["id"]
    record = client.get(keys.job(job_id)) or ""
    assert (records.parse(record))["owner"] == api_key_digest(ALICE)
    assert ALICE not in record


def test_an_idempotency_key_is_scoped_to_its_api_key(http: FlaskClient) -> None:
    a = http.post("/submit", json=job(1, idempotency_key="order-1"), headers=as_(ALICE))
    b = http.post("/submit", json=job(2, idempotency_key="order-1"), headers=as_(BOB))
    again = http.post("/submit", json=job(1, idempotency_key="order-1"), headers=as_(ALICE))
    assert a.status_code == b.status_code == again.status_code == 202  # no 422 across keys
    assert a.get_json()["id"] != b.get_json()["id"]
    assert again.get_json()["id"] == a.get_json()["id"]


def test_health_models_and_openapi_need_no_key(http: FlaskClient) -> None:
    for path in ("/healthz", "/readyz", "/models", "/openapi.json"):
        assert http.get(path).status_code == 200, path


def test_keys_come_from_a_file_too_and_short_keys_are_refused(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# one per line\n{ALICE}\n\n")
    settings = load_settings(make_env("redis://127.0.0.1:6379/0", "p",
                                      CARPOOL_API_KEYS_FILE=str(keys_file)))
    assert settings.api_key_digests == {api_key_digest(ALICE)}
    with pytest.raises(ConfigError, match="shorter than"):
        load_settings(make_env("redis://127.0.0.1:6379/0", "p", CARPOOL_API_KEYS="short"))


def test_without_keys_anyone_with_the_id_reads_the_job(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis) -> None:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as open_http:
        job_id = open_http.post("/submit", json=job()).get_json()["id"]
        assert open_http.get(f"/result/{job_id}", headers=as_(BOB)).status_code == 200


def test_the_owner_check_read_is_the_only_read_before_a_pending_jobs_end(
        http: FlaskClient, queue: Queue, client: redis.Redis, keys: Keys) -> None:
    state = app_state(http)
    wait_until(state.notifier.listening, 5.0, "the listener's subscription")
    job_id = http.post("/submit", json=job(), headers=as_(ALICE)).get_json()["id"]
    wait_until(lambda: state.notifier.pending() == 1, 5.0, "the admission notice")
    reads = state.reads.calls
    before = reads.round_trips
    read_while_waiting: list[int] = []

    def complete_once_polled() -> None:
        wait_until(lambda: state.notifier.watching(job_id) == 1, 5.0, "the poll to wait")
        read_while_waiting.append(reads.round_trips - before)
        run_queued_jobs(http, queue)

    worker = threading.Thread(target=complete_once_polled)
    worker.start()
    body = http.get(f"/result/{job_id}?wait=5", headers=as_(ALICE)).get_json()
    worker.join(10)
    assert body["status"] == "done"
    # The re-read after the end is the view the completion pushed (carpool/backend/pushed.py).
    assert read_while_waiting == [1] and reads.round_trips - before == 1
    # Final, and pushed: answered from memory, owner checked all the same.
    assert http.get(f"/result/{job_id}?wait=5", headers=as_(ALICE)).get_json() == body
    assert http.get(f"/result/{job_id}", headers=as_(BOB)).status_code == 404
    assert reads.round_trips - before == 1
