"""What an answer promises, under timing and guessing: real gunicorn, private Redis.

A 503 names the id it may have admitted; an idempotency key whose job is gone is
a new key; a conflict never names another client's job; polls do not read the
input; /metrics can be closed with its own token.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.core.jobs import is_job_id
from tests.conftest import make_env
from tests.support.procs import start_web
from tests.support.redisproc import RedisProc, private_redis
from tests.support.webtools import CATALOGUE_TOML, MAX_BODY_BYTES, png

#: Polls of one queued image in the input-read test.
POLLS = 20
#: Redis blocks a submit this long at most (the web's socket timeout is 5 s).
STOPPED_SUBMIT_TIMEOUT_S = 30
METRICS_TOKEN = "m" * 32


@pytest.fixture
def server() -> Iterator[RedisProc]:
    with private_redis() as server:
        yield server


@pytest.fixture
def env(server: RedisProc, tmp_path: Path, key_prefix: str) -> dict[str, str]:
    config = tmp_path / "catalogue.toml"
    config.write_text(CATALOGUE_TOML)
    return make_env(server.url, key_prefix, CARPOOL_CONFIG=str(config),
                    CARPOOL_MAX_BODY_BYTES=str(MAX_BODY_BYTES))


def submit(base: str, value: Any, key: str | None = None) -> requests.Response:
    body: dict[str, Any] = {"model": "tiny", "input": {"value": value, "size": 1}}
    if key is not None:
        body["idempotency_key"] = key
    return requests.post(f"{base}/submit", json=body, timeout=STOPPED_SUBMIT_TIMEOUT_S)


def test_a_503_during_admission_names_the_id_that_may_have_been_admitted(
        env: dict[str, str], server: RedisProc) -> None:
    with start_web(env) as base:
        assert requests.get(f"{base}/readyz", timeout=10).status_code == 200
        server.signal(signal.SIGSTOP)
        try:
            r = submit(base, "paused")
        finally:
            server.signal(signal.SIGCONT)
        assert r.status_code == 503
        job_id = r.json()["id"]
        assert "may have been admitted" in r.json()["error"]["message"]
        # Whether the script, left in Redis's socket buffer, ran on resume or not, the
        # id tells: queued under it, or unknown (404) and safe to submit again.
        answer = requests.get(f"{base}/result/{job_id}", timeout=10)
        assert answer.status_code in (200, 404)
        if answer.status_code == 200:
            assert answer.json()["id"] == job_id and answer.json()["status"] == "queued"


def test_a_batch_that_meets_a_paused_redis_names_every_id_its_admission_held(
        env: dict[str, str], server: RedisProc) -> None:
    inputs = [{"value": i, "size": 1} for i in range(3)]
    with start_web(env) as base:
        assert requests.get(f"{base}/readyz", timeout=10).status_code == 200
        server.signal(signal.SIGSTOP)
        try:
            r = requests.post(f"{base}/submit/batch", json={"model": "tiny", "inputs": inputs},
                              timeout=STOPPED_SUBMIT_TIMEOUT_S)
        finally:
            server.signal(signal.SIGCONT)
    assert r.status_code == 503
    # The three inputs went to Redis in one admit.lua call: any of them may be queued.
    ids = r.json()["ids"]
    assert len(ids) == 3 and all(is_job_id(i) for i in ids) and len(set(ids)) == 3
    assert "may have been admitted" in r.text


def test_an_idempotency_key_whose_job_was_deleted_or_expired_is_a_new_key(
        env: dict[str, str], server: RedisProc, key_prefix: str) -> None:
    with start_web(env) as base:
        first = submit(base, 1, key="invoice-1").json()["id"]
        assert requests.delete(f"{base}/result/{first}", timeout=10).status_code == 200
        again = submit(base, 1, key="invoice-1").json()
        assert again["id"] != first and "duplicate" not in again
        # Its record expires (the result's TTL is shorter than the key's).
        with server.client() as c:
            c.delete(Keys(key_prefix).job(again["id"]))
        third = submit(base, 1, key="invoice-1").json()
        assert third["id"] not in (first, again["id"]) and "duplicate" not in third
        assert requests.get(f"{base}/result/{third['id']}", timeout=10).status_code == 200


def test_an_idempotency_conflict_never_names_the_other_job(env: dict[str, str]) -> None:
    with start_web(env) as base:
        first = submit(base, 1, key="invoice-2").json()["id"]
        r = submit(base, 2, key="invoice-2")
        assert r.status_code == 422
        assert first not in r.text


def test_polling_a_queued_image_never_sends_its_input(env: dict[str, str],
                                                      server: RedisProc) -> None:
    image = png(600, 600)  # about 1 KB as PNG, but any size: the point is the ratio
    noise = base64.b64encode(bytes(range(256)) * 2000).decode()  # padding, in the input
    with start_web(env) as base, server.client() as c:
        r = requests.post(f"{base}/submit?model=imgs", data=image,
                          headers={"Content-Type": "image/png"}, timeout=10)
        job_id = r.json()["id"]
        records.update(c, Keys(env["CARPOOL_KEY_PREFIX"]).job(job_id), input=noise)  # big
        before = int(c.info("stats")["total_net_output_bytes"])
        for _ in range(POLLS):
            assert requests.get(f"{base}/result/{job_id}", timeout=10).status_code == 200
        sent = int(c.info("stats")["total_net_output_bytes"]) - before
    assert sent < len(noise), f"{POLLS} polls made Redis send {sent} bytes"


def test_metrics_with_a_token_answers_401_without_it(env: dict[str, str]) -> None:
    with start_web({**env, "CARPOOL_METRICS_TOKEN": METRICS_TOKEN}) as base:
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 401
        wrong = requests.get(f"{base}/metrics", headers={"Authorization": "Bearer nope"},
                             timeout=10)
        assert wrong.status_code == 401
        ok = requests.get(f"{base}/metrics",
                          headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
        assert ok.status_code == 200 and "carpool_jobs_submitted_total" in ok.text
