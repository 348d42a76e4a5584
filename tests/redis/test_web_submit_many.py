"""POST /submit/batch: one entry per input, in order; each input fails alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.core.catalogue import load_catalogue
from carpool.intake.inputs import MAX_MANY_INPUTS
from tests.support.procs import free_port
from tests.support.webtools import app_state, web_client, web_settings

BATCH = "/submit/batch"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def item(size: Any) -> dict[str, Any]:
    return {"value": "v", "size": size}


def test_batch_answers_one_entry_per_input_in_order_with_per_item_errors(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    inputs = [item(1), item(-1), item(2000), "not an object", item(200), item(True)]
    resp = http.post(BATCH, json={"model": "synthetic", "inputs": inputs, "priority": 3})
    assert resp.status_code == 202
    jobs = resp.get_json()["jobs"]
    assert [j.get("status") for j in jobs] == ["queued", 400, 413, 400, "queued", 400]
    assert [j["bin"] for j in jobs if "id" in j] == ["small", "medium"]
    assert jobs[2]["error"]["code"] == "input_too_large"
    assert all(j["result_url"] == f"/result/{j['id']}" for j in jobs if "id" in j)
    assert client.zrange(keys.bin("synthetic", "small"), 0, -1) == [jobs[0]["id"]]
    assert (records.read(client, keys.job(jobs[4]["id"])) or {})["priority"] == "3"


def test_batch_into_a_bin_that_fills_refuses_only_the_overflow(http: FlaskClient) -> None:
    resp = http.post(BATCH, json={"model": "tiny", "inputs": [item(1)] * 3})
    assert [j["status"] for j in resp.get_json()["jobs"]] == ["queued", "queued", 429]


def test_batch_over_the_input_bound_answers_413(http: FlaskClient) -> None:
    resp = http.post(BATCH, json={"model": "synthetic",
                                  "inputs": [item(1)] * (MAX_MANY_INPUTS + 1)})
    assert resp.status_code == 413
    assert resp.get_json()["error"]["code"] == "too_many_inputs"


@pytest.mark.parametrize(
    ("body", "status"),
    [({"model": "synthetic", "inputs": []}, 400),
     ({"model": "synthetic", "inputs": {"a": 1}}, 400),
     ({"model": "synthetic", "inputs": [item(1)], "idempotency_key": "k"}, 400),
     ({"model": "synthetic", "inputs": [item(1)], "deadline_ms": -5}, 400),
     ({"model": "nope", "inputs": [item(1)]}, 404)],
    ids=["empty", "not-a-list", "idempotency-key", "bad-deadline", "unknown-model"],
)
def test_malformed_batch_is_refused_whole(http: FlaskClient, client: redis.Redis, keys: Keys,
                                          body: Any, status: int) -> None:
    resp = http.post(BATCH, json=body)
    assert resp.status_code == status
    answer = resp.get_json()
    assert "jobs" not in answer and answer["error"]["code"]  # one error for the whole batch
    # Not one input admitted, the well-formed ones neither.
    bins = [keys.bin("synthetic", b.name) for b in load_catalogue(None).get("synthetic").bins]
    assert [client.zcard(b) for b in bins] == [0] * len(bins)


def test_batch_refuses_an_idempotency_key_header(http: FlaskClient) -> None:
    resp = http.post(BATCH, json={"model": "synthetic", "inputs": [item(1)]},
                     headers={"Idempotency-Key": "k"})
    assert resp.status_code == 400


def test_batch_that_is_not_json_answers_415(http: FlaskClient) -> None:
    assert http.post(BATCH, data=b"x", content_type="text/plain").status_code == 415


def test_batch_with_redis_unreachable_answers_503(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with web_client(web_settings(closed, key_prefix, tmp_path)) as http:
        resp = http.post(BATCH, json={"model": "synthetic", "inputs": [item(1), item(2)]})
        assert resp.status_code == 503
        assert "Retry-After" in resp.headers


def test_batch_that_loses_redis_midway_keeps_the_queued_and_marks_the_rest_503(
    http: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch over two bins is one admit.lua call per bin: Redis is lost between them."""
    admissions = app_state(http).admissions
    real_admit = admissions._admit
    calls: list[int] = []

    def admit_then_lose_redis(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise redis.ConnectionError("simulated")
        return real_admit(*args, **kwargs)

    monkeypatch.setattr(admissions, "_admit", admit_then_lose_redis)
    inputs = [item(1), item(200), item(1), item(300)]  # small, medium, small, medium
    resp = http.post(BATCH, json={"model": "synthetic", "inputs": inputs})
    assert resp.status_code == 202
    assert [j["status"] for j in resp.get_json()["jobs"]] == ["queued", 503, "queued", 503]
    assert len(calls) == 2  # no further round trip once Redis is known to be gone


def test_a_batch_input_nested_past_the_depth_limit_fails_alone(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    resp = http.post(BATCH, json={"model": "synthetic", "inputs": [item(1), {"value": deep,
                                                                              "size": 1}]})
    first, second = resp.get_json()["jobs"]
    assert first["status"] == "queued"
    assert second["status"] == 400 and second["error"]["code"] == "input_over_limit"
    assert "CARPOOL_MAX_INPUT_DEPTH" in second["error"]["message"]
    assert client.zrange(keys.bin("synthetic", "small"), 0, -1) == [first["id"]]
