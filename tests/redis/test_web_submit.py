"""POST /submit on real Redis: every answer a client can get, and what lands in the bin."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.admission.retry_after import RETRY_AFTER_MAX_S
from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.core.jobs import JOB_ID_CHARS
from carpool.intake import inputs
from tests.support.procs import free_port
from tests.support.webtools import MAX_BODY_BYTES, web_client, web_settings

SUBMIT = "/submit"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    # `client` (the conftest fixture) deletes this test's keys afterwards.
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def job(size: Any = 3, value: Any = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "synthetic", "input": {"value": value, "size": size}, **extra}


def error_code(resp: Any) -> str:
    return str(resp.get_json()["error"]["code"])


def test_valid_submit_answers_202_and_queues_the_job_in_its_bin(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    resp = http.post(SUBMIT, json=job(size=100, value={"a": [1, 2]}))
    assert resp.status_code == 202
    body = resp.get_json()
    assert body == {"id": body["id"], "status": "queued", "model": "synthetic",
                    "model_version": "1", "bin": "medium", "result_url": f"/result/{body['id']}"}
    assert resp.headers["Location"] == body["result_url"]
    assert client.zrange(keys.bin("synthetic", "medium"), 0, -1) == [body["id"]]
    stored = (records.read(client, keys.job(body["id"])) or {}).get("input")
    assert stored == '{"size":100,"value":{"a":[1,2]}}'


def test_deadline_and_priority_are_stored_with_the_job(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    resp = http.post(SUBMIT, json=job(deadline_ms=5000, priority=7))
    assert resp.status_code == 202
    record = records.read(client, keys.job(resp.get_json()["id"])) or {}
    assert record["priority"] == "7"
    assert int(record["deadline"]) == int(record["t_admit"]) + 5000


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (["not", "an", "object"], "body is an array"),
        ({"input": {"value": 1, "size": 1}}, "model missing"),
        ({"model": "synthetic"}, "input missing"),
        ({"model": 7, "input": {"value": 1, "size": 1}}, "model not a string"),
        (job(colour="red"), "unknown top-level key"),
        ({"model": "synthetic", "input": [1, 2]}, "input not an object"),
        ({"model": "synthetic", "input": {"size": 1}}, "value missing"),
        ({"model": "synthetic", "input": {"value": 1, "size": 1, "x": 0}}, "unknown input key"),
        (job(size="3"), "size a string"),
        (job(size=True), "size a bool"),
        (job(size=2.0), "size a float"),
        (job(size=-1), "size negative"),
        (job(deadline_ms=0), "deadline zero"),
        (job(deadline_ms=True), "deadline a bool"),
        (job(deadline_ms=25 * 3600 * 1000), "deadline over a day"),
        (job(priority=10), "priority over 9"),
        (job(priority=-1), "priority negative"),
        (job(priority=False), "priority a bool"),
        (job(priority="1"), "priority a string"),
        (job(idempotency_key=""), "empty idempotency key"),
        (job(idempotency_key=5), "idempotency key a number"),
    ],
)
def test_malformed_submission_answers_400_with_a_message(
    http: FlaskClient, body: Any, what: str
) -> None:
    resp = http.post(SUBMIT, json=body)
    assert resp.status_code == 400, what
    assert error_code(resp) == "invalid_input"
    assert resp.get_json()["error"]["message"]


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b'{"model": "synthetic", "input": NaN}', b"\xff\xfe\x00garbage",
     b"[" * 100_000 + b"]" * 100_000, b'{"model": "synthetic", "input": {"value": 1, "size": '
     + b"9" * 5000 + b"}}", b""],
    ids=["syntax", "nan", "bad-utf8", "deep-nesting", "huge-int", "empty"],
)
def test_body_that_is_not_json_answers_400_invalid_json(http: FlaskClient, raw: bytes) -> None:
    resp = http.post(SUBMIT, data=raw, content_type="application/json")
    assert resp.status_code == 400
    assert error_code(resp) == "invalid_json"


def test_unpaired_surrogate_in_input_answers_400_not_500(http: FlaskClient) -> None:
    raw = b'{"model": "synthetic", "input": {"value": "\\ud800", "size": 1}}'
    resp = http.post(SUBMIT, data=raw, content_type="application/json")
    assert resp.status_code == 400


def test_unknown_model_answers_404(http: FlaskClient) -> None:
    resp = http.post(SUBMIT, json={"model": "nope", "input": {}})
    assert resp.status_code == 404
    assert error_code(resp) == "unknown_model"
    assert "synthetic" in resp.get_json()["error"]["message"]  # it lists the known ones


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_wrong_content_type_answers_415(http: FlaskClient, content_type: str) -> None:
    resp = http.post(SUBMIT, data=json.dumps(job()), content_type=content_type)
    assert resp.status_code == 415
    assert error_code(resp) == "unsupported_media_type"


def test_body_over_max_body_bytes_answers_413(http: FlaskClient) -> None:
    resp = http.post(SUBMIT, data=b"x" * (MAX_BODY_BYTES + 1), content_type="application/json")
    assert resp.status_code == 413
    assert error_code(resp) == "body_too_large"


def test_input_over_the_models_byte_limit_answers_413(http: FlaskClient) -> None:
    resp = http.post(SUBMIT, json=job(value="x" * (64 << 10)))
    assert resp.status_code == 413
    assert error_code(resp) == "input_too_large"


def test_size_over_the_largest_bin_answers_413_naming_the_bin(http: FlaskClient) -> None:
    resp = http.post(SUBMIT, json=job(size=1025))
    assert resp.status_code == 413
    assert "largest bin (1024)" in resp.get_json()["error"]["message"]


def test_repeated_idempotency_key_answers_the_first_jobs_id(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    first = http.post(SUBMIT, json=job(idempotency_key="order-17"))
    again = http.post(SUBMIT, json=job(), headers={"Idempotency-Key": "order-17"})
    assert first.status_code == again.status_code == 202
    assert again.get_json()["id"] == first.get_json()["id"]
    assert again.get_json()["duplicate"] is True
    assert "duplicate" not in first.get_json()
    assert client.zcard(keys.bin("synthetic", "small")) == 1


def test_idempotency_key_reused_with_another_input_answers_422(http: FlaskClient) -> None:
    assert http.post(SUBMIT, json=job(value=1, idempotency_key="k")).status_code == 202
    resp = http.post(SUBMIT, json=job(value=2, idempotency_key="k"))
    assert resp.status_code == 422
    assert error_code(resp) == "idempotency_conflict"


def test_idempotency_key_in_body_and_header_must_agree(http: FlaskClient) -> None:
    resp = http.post(SUBMIT, json=job(idempotency_key="a"), headers={"Idempotency-Key": "b"})
    assert resp.status_code == 400


def test_full_bin_answers_429_with_retry_after(http: FlaskClient) -> None:
    tiny = {"model": "tiny", "input": {"value": 0, "size": 1}}
    assert [http.post(SUBMIT, json=tiny).status_code for _ in range(2)] == [202, 202]
    resp = http.post(SUBMIT, json=tiny)
    assert resp.status_code == 429
    assert error_code(resp) == "bin_full"
    # No worker has ever drained this bin: its drain rate is 0, so the answer is the cap.
    assert resp.headers["Retry-After"] == str(int(RETRY_AFTER_MAX_S))


def test_unreachable_redis_answers_503_with_retry_after(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with web_client(web_settings(closed, key_prefix, tmp_path)) as http:
        for resp in (http.post(SUBMIT, json=job()), http.get("/models"), http.get("/readyz"),
                     http.get("/result/" + "a" * JOB_ID_CHARS)):
            assert resp.status_code == 503
            assert error_code(resp) == "backend_unavailable"
            assert int(resp.headers["Retry-After"]) >= 1
        assert http.get("/healthz").status_code == 200  # liveness never asks Redis


def test_text_input_is_binned_by_a_measure_that_can_be_replaced(
    http: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    text_job = {"model": "texts", "input": {"text": "two words"}}
    assert http.post(SUBMIT, json=text_job).get_json()["bin"] == "short"
    monkeypatch.setitem(inputs._TEXT_MEASURES, "tokens", inputs.estimate_tokens)  # undone after
    inputs.register_measure("tokens", lambda spec, text: 100 * len(text.split()))
    assert http.post(SUBMIT, json=text_job).get_json()["bin"] == "long"
    inputs.register_measure("tokens", lambda spec, text: 10_000)
    assert http.post(SUBMIT, json=text_job).status_code == 413


@pytest.mark.parametrize(
    ("text", "status"),
    [("", 400), (7, 400), ("x" * 1001, 413)],
    ids=["empty", "not-a-string", "over-max-chars"],
)
def test_bad_text_input_is_refused(http: FlaskClient, text: Any, status: int) -> None:
    resp = http.post(SUBMIT, json={"model": "texts", "input": {"text": text}})
    assert resp.status_code == status


def test_a_model_applies_its_default_deadline_and_refuses_one_over_its_maximum(
    http: FlaskClient, client: redis.Redis, keys: Keys
) -> None:
    tiny = {"model": "tiny", "input": {"value": 0, "size": 1}}
    resp = http.post(SUBMIT, json=tiny)
    record = records.read(client, keys.job(resp.get_json()["id"])) or {}
    assert int(record["deadline"]) == int(record["t_admit"]) + 4000
    over = http.post(SUBMIT, json={**tiny, "deadline_ms": 60001})
    assert over.status_code == 400 and "60000" in over.get_json()["error"]["message"]


def test_an_input_nested_900_deep_answers_400_naming_the_depth_limit_and_queues_nothing(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    body = (b'{"model": "synthetic", "input": {"value": ' + b"[" * 900 + b"]" * 900
            + b', "size": 10}}')
    resp = http.post(SUBMIT, data=body, content_type="application/json")
    assert resp.status_code == 400
    assert error_code(resp) == "input_over_limit"
    message = resp.get_json()["error"]["message"]
    assert message.startswith("input.value[0][0]") and "is nested 33 deep" in message
    assert "at most 32 levels" in message and "CARPOOL_MAX_INPUT_DEPTH" in message
    assert client.zcard(keys.bin("synthetic", "medium")) == 0


def test_json_nested_past_pythons_parser_answers_400_not_500(http: FlaskClient) -> None:
    resp = http.post(SUBMIT, data=b'{"model": "synthetic", "input": ' + b"[" * 50_000,
                     content_type="application/json")
    assert resp.status_code == 400 and error_code(resp) == "invalid_json"
    assert "nested too deeply to parse" in resp.get_json()["error"]["message"]
