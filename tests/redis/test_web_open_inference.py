"""The Open Inference Protocol's routes (web/open_inference/routes.py) on a real Redis: metadata and
configuration, the malformed-request corpus, refusals, options, API keys."""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.backend.registry import Registry
from carpool.core.settings import api_key_digest, load_settings
from tests.conftest import make_env
from tests.support.redisproc import private_redis
from tests.support.webtools import CATALOGUE_TOML, MAX_BODY_BYTES, web_client
from web.open_inference.routes import MIN_INFER_WAIT_S

#: A python model whose tensors are UINT8 and INT64, and a model to refuse part of a
#: request: it batches 3 and holds 3.
V2_TOML = """
[models.pixels]
kind = "python"
handler = "nowhere:Handler"
measure = "bytes"
input_schema = {type = "object", required = ["pixels", "count"]}
[models.pixels.tensors]
inputs = [{name = "PIXELS", datatype = "UINT8", shape = [4], field = "pixels"},
          {name = "COUNT", datatype = "INT64", shape = [1], field = "count"}]
outputs = [{name = "SUM", datatype = "INT64", shape = [1], field = "sum"}]
[[models.pixels.bins]]
name = "all"
max_size = 4096
max_batch = 8
max_wait_ms = 5
max_depth = 100

[models.three]
kind = "synthetic"
measure = "size"
[[models.three.bins]]
name = "only"
max_size = 10
max_batch = 3
max_wait_ms = 5
max_depth = 3
"""
INFER = "/v2/models/synthetic/infer"
KEY = "k-v2-test-0123456789abcdef"


def settings_for(redis_url: str, key_prefix: str, tmp_path: Path, **extra: str) -> Any:
    config = tmp_path / "catalogue.toml"
    config.write_text(CATALOGUE_TOML + V2_TOML)
    return load_settings(make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config),
                                  CARPOOL_MAX_BODY_BYTES=str(MAX_BODY_BYTES), **extra))


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(settings_for(redis_url, key_prefix, tmp_path)) as c:
        yield c


def value(rows: list[list[float]]) -> dict[str, Any]:
    return {"name": "VALUE", "datatype": "FP32", "shape": [len(rows), len(rows[0])],
            "data": rows}


def binary_body(header: dict[str, Any], *parts: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(parts), {"Inference-Header-Content-Length": str(len(head))}


def fp32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def binary_value(size: int, n: int = 3) -> dict[str, Any]:
    return {"inputs": [{"name": "VALUE", "datatype": "FP32", "shape": [1, n],
                        "parameters": {"binary_data_size": size}}]}


def _case(path: str, body: Any, status: int = 400,
          headers: dict[str, str] | None = None) -> tuple[str, bytes, dict[str, str], int]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return path, raw, headers or {}, status


_BIN_TRUNCATED = binary_body(binary_value(12), fp32(1.0, 2.0))
_BIN_EXTRA = binary_body(binary_value(12), fp32(1.0, 2.0, 3.0, 4.0))
_BIN_WRONG_SIZE = binary_body(binary_value(8), fp32(1.0, 2.0))
_BIN_NAN = binary_body(binary_value(12), fp32(1.0, math.nan, 3.0))
_TEXT_PREFIX_CUT = binary_body({"inputs": [{"name": "TEXT", "datatype": "BYTES",
                                            "shape": [1, 1],
                                            "parameters": {"binary_data_size": 3}}]},
                               b"\x05\x00\x00")
_TEXT_NOT_UTF8 = binary_body({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1],
                                          "parameters": {"binary_data_size": 6}}]},
                             struct.pack("<I", 2) + b"\xff\xfe")
_IMAGE_NOT_IMAGE = binary_body({"inputs": [{"name": "IMAGE", "datatype": "BYTES",
                                            "shape": [1, 1],
                                            "parameters": {"binary_data_size": 9}}]},
                               struct.pack("<I", 5) + b"hello")
_GOOD = {"inputs": [value([[1.0, 2.0]])]}

#: (path, body, headers, status): each a malformed infer request, none a 5xx.
CORPUS: dict[str, tuple[str, bytes, dict[str, str], int]] = {
    "not-json": _case(INFER, b"{"),
    "json-array": _case(INFER, [1, 2]),
    "no-inputs": _case(INFER, {"id": "x"}),
    "empty-inputs": _case(INFER, {"inputs": []}),
    "unknown-key": _case(INFER, {**_GOOD, "model": "synthetic"}),
    "body-names-another-model": _case(INFER, {**_GOOD, "model_name": "minilm"}),
    "id-not-string": _case(INFER, {**_GOOD, "id": 7}),
    "input-not-object": _case(INFER, {"inputs": ["VALUE"]}),
    "no-datatype": _case(INFER, {"inputs": [{"name": "VALUE", "shape": [1, 1], "data": [1]}]}),
    "unknown-datatype": _case(INFER, {"inputs": [{**value([[1.0]]), "datatype": "FP8"}]}),
    "wrong-datatype": _case(INFER, {"inputs": [{**value([[1.0]]), "datatype": "INT64",
                                                "data": [1]}]}),
    "shape-data-mismatch": _case(INFER, {"inputs": [{**value([[1.0, 2.0, 3.0]]),
                                                     "data": [1.0, 2.0]}]}),
    "shape-not-list": _case(INFER, {"inputs": [{**value([[1.0]]), "shape": "1,1"}]}),
    "negative-dim": _case(INFER, {"inputs": [{**value([[1.0]]), "shape": [1, -1]}]}),
    "wrong-rank": _case(INFER, {"inputs": [{**value([[1.0]]), "shape": [1]}]}),
    "over-max-batch-size": _case(INFER, {"inputs": [value([[1.0]] * 33)]}),
    "zero-rows": _case(INFER, {"inputs": [{**value([[1.0]]), "shape": [0, 1], "data": []}]}),
    "string-for-fp32": _case(INFER, {"inputs": [value([["1.0"]])]}),  # type: ignore[list-item]
    "bool-for-fp32": _case(INFER, {"inputs": [value([[True]])]}),
    "integer-of-309-digits": _case(INFER, {"inputs": [value([[10**309]])]}),
    "fp32-beyond-its-range": _case(INFER, {"inputs": [value([[1.0, 1e39]])]}),
    "int-beyond-fp32-range": _case(INFER, {"inputs": [value([[1, -(10**39)]])]}),
    "uint8-out-of-range": _case("/v2/models/pixels/infer", {"inputs": [
        {"name": "PIXELS", "datatype": "UINT8", "shape": [1, 4], "data": [1, 2, 3, 256]},
        {"name": "COUNT", "datatype": "INT64", "shape": [1, 1], "data": [4]}]}),
    "missing-input": _case("/v2/models/pixels/infer", {"inputs": [
        {"name": "COUNT", "datatype": "INT64", "shape": [1, 1], "data": [4]}]}),
    "unknown-input": _case(INFER, {"inputs": [{**value([[1.0]]), "name": "INPUT0"}]}),
    "input-twice": _case(INFER, {"inputs": [value([[1.0]]), value([[1.0]])]}),
    "unknown-output": _case(INFER, {**_GOOD, "outputs": [{"name": "OUTPUT0"}]}),
    "outputs-not-list": _case(INFER, {**_GOOD, "outputs": {"name": "ECHO"}}),
    "classification": _case(INFER, {**_GOOD, "outputs": [
        {"name": "ECHO", "parameters": {"classification": 3}}]}),
    "parameters-not-object": _case(INFER, {**_GOOD, "parameters": [1]}),
    "header-length-not-a-number": _case(INFER, json.dumps(_GOOD).encode(), 400,
                                        {"Inference-Header-Content-Length": "12abc"}),
    "header-length-past-body": _case(INFER, json.dumps(_GOOD).encode(), 400,
                                     {"Inference-Header-Content-Length": "99999"}),
    "binary-truncated": _case(INFER, _BIN_TRUNCATED[0], 400, _BIN_TRUNCATED[1]),
    "binary-extra-bytes": _case(INFER, _BIN_EXTRA[0], 400, _BIN_EXTRA[1]),
    "binary-size-not-elements": _case(INFER, _BIN_WRONG_SIZE[0], 400, _BIN_WRONG_SIZE[1]),
    "binary-nan": _case(INFER, _BIN_NAN[0], 400, _BIN_NAN[1]),
    "binary-and-data": _case(INFER, {"inputs": [{**value([[1.0]]),
                                                 "parameters": {"binary_data_size": 4}}]}),
    "bytes-length-prefix-cut": _case("/v2/models/texts/infer", _TEXT_PREFIX_CUT[0], 400,
                                     _TEXT_PREFIX_CUT[1]),
    "text-not-utf8": _case("/v2/models/texts/infer", _TEXT_NOT_UTF8[0], 400, _TEXT_NOT_UTF8[1]),
    "image-not-an-image": _case("/v2/models/imgs/infer", _IMAGE_NOT_IMAGE[0], 400,
                                _IMAGE_NOT_IMAGE[1]),
    "priority-out-of-range": _case(INFER, {**_GOOD, "parameters": {"priority": 11}}),
    "timeout-negative": _case(INFER, {**_GOOD, "parameters": {"timeout": -5}}),
    "timeout-not-a-number": _case(INFER, {**_GOOD, "parameters": {"timeout": "1s"}}),
    "sequence-id": _case(INFER, {**_GOOD, "parameters": {"sequence_id": 3}}),
    "deep-data": _case(INFER, {"inputs": [{**value([[1.0]]), "data": [[[[[[[[[[[1.0]]]]]]]]]]]}]}),
    "json-nested-past-the-parser": _case(INFER, b'{"inputs": ' + b"[" * 5000),
    "unknown-model": _case("/v2/models/nope/infer", _GOOD, 404),
    "unknown-version": _case("/v2/models/synthetic/versions/2/infer", _GOOD, 404),
    "gzip-body": _case(INFER, b"\x1f\x8b\x08\x00", 415, {"Content-Encoding": "gzip"}),
}


def send(http: FlaskClient, path: str, body: bytes, headers: dict[str, str]) -> Any:
    return http.post(path, data=body, headers=headers)


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_malformed_infer_answers_4xx_with_the_protocols_error_body(
        http: FlaskClient, client: redis.Redis, keys: Keys, case: str) -> None:
    path, body, headers, status = CORPUS[case]
    resp = send(http, path, body, headers)
    assert resp.status_code == status, resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert isinstance(error, str) and len(error) > 10  # a message, not a code
    assert not list(client.scan_iter(match=f"*{keys.bin('synthetic', 'small')}*"))
    assert http.get("/v2/health/ready").status_code == 200  # and it keeps serving


def test_the_corpus_has_at_least_25_cases_and_none_expects_a_5xx() -> None:
    assert len(CORPUS) >= 25 and all(400 <= s < 500 for *_, s in CORPUS.values())


def test_a_row_nested_past_the_input_depth_is_refused_naming_the_row_and_the_limit(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis,
        keys: Keys) -> None:
    settings = settings_for(redis_url, key_prefix, tmp_path, CARPOOL_MAX_INPUT_DEPTH="1")
    with web_client(settings) as http:
        resp = http.post(INFER, json={"inputs": [value([[1.0, 2.0]])]})
    assert resp.status_code == 400
    assert resp.get_json()["error"] == (
        "row 0: input.value is nested 2 deep: an input may nest at most 1 levels of arrays "
        "and objects (CARPOOL_MAX_INPUT_DEPTH)")
    assert not list(client.scan_iter(match=f"*{keys.bin('synthetic', 'small')}*"))


def test_a_body_over_its_models_infer_limit_is_refused_before_it_is_parsed(
        http: FlaskClient) -> None:
    # synthetic: 32 rows of at most 64 KiB of JSON each, with slack: under 7 MiB, while
    # the server's cap (8 MiB) would let this through.
    resp = http.post(INFER, data=b"[" * (7 << 20))
    assert resp.status_code == 413 and "over" in resp.get_json()["error"]


def test_server_metadata_and_health(http: FlaskClient) -> None:
    assert http.get("/v2/health/live").status_code == 200
    assert http.get("/v2/health/ready").status_code == 200
    server = http.get("/v2").get_json()
    assert server["name"] == "carpool"
    assert set(server["extensions"]) >= {"binary_tensor_data", "model_configuration"}


def test_each_model_declares_its_tensors_with_the_batch_dimension_first(
        http: FlaskClient) -> None:
    meta = {m: http.get(f"/v2/models/{m}").get_json() for m in ("imgs", "texts", "pixels")}
    assert meta["imgs"]["inputs"] == [{"name": "IMAGE", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["texts"]["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    assert [t["datatype"] for t in meta["pixels"]["inputs"]] == ["UINT8", "INT64"]
    assert meta["pixels"]["versions"] == ["1"]
    assert http.get("/v2/models/pixels/versions/1").get_json() == meta["pixels"]


def test_the_config_maps_bins_onto_dynamic_batching(http: FlaskClient) -> None:
    cfg = http.get("/v2/models/imgs/config").get_json()
    assert cfg["max_batch_size"] == 8  # the fast lane's max_batch, the larger
    batching = cfg["dynamic_batching"]
    assert batching["preferred_batch_size"] == [2, 8]
    assert batching["max_queue_delay_microseconds"] == 50_000
    assert batching["priority_levels"] == 10
    assert cfg["input"] == [{"name": "IMAGE", "data_type": "TYPE_STRING", "dims": [1]}]


def test_perf_analyzers_preload_calls_answer_as_it_reads_them(http: FlaskClient) -> None:
    # perf_analyzer (HTTP, Triton service kind) reads, before it sends load: the model
    # metadata (inputs' names, datatypes, shapes), the model configuration
    # (max_batch_size, the batcher, the transaction policy), then the model statistics
    # around each measurement window. Model version "" is the path without /versions.
    meta = http.get("/v2/models/synthetic")
    cfg = http.get("/v2/models/synthetic/config")
    stats = http.get("/v2/models/synthetic/stats")
    assert [r.status_code for r in (meta, cfg, stats)] == [200, 200, 200]
    inputs = meta.get_json()["inputs"]
    assert inputs == [{"name": "VALUE", "datatype": "FP32", "shape": [-1, -1]}]
    config = cfg.get_json()
    assert config["max_batch_size"] == 32 and "sequence_batching" not in config
    assert "ensemble_scheduling" not in config
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert config["input"][0]["dims"] == [-1]  # the batch dimension left out, as Triton does
    (entry,) = stats.get_json()["model_stats"]
    assert entry["name"] == "synthetic" and entry["inference_stats"]["success"]["count"] == 0


def test_a_model_no_worker_serves_is_not_ready(http: FlaskClient) -> None:
    resp = http.get("/v2/models/synthetic/ready")
    assert resp.status_code == 400 and "no live worker serves it" in resp.get_json()["error"]


def test_unknown_paths_under_v2_answer_404_in_the_protocols_shape(http: FlaskClient) -> None:
    resp = http.get("/v2/repository/nope")
    assert resp.status_code == 404 and isinstance(resp.get_json()["error"], str)
    resp = http.get("/v2/repository/index")  # a known path, a method it does not take
    assert resp.status_code == 405 and isinstance(resp.get_json()["error"], str)
    assert "POST" in resp.headers["Allow"]


def test_a_full_bin_answers_429_with_retry_after(http: FlaskClient) -> None:
    for _ in range(2):  # tiny holds 2
        assert http.post("/submit", json={"model": "tiny", "input": {"value": 0, "size": 1}}
                         ).status_code == 202
    resp = http.post("/v2/models/tiny/infer", json={"inputs": [value([[1.0]])]})
    assert resp.status_code == 429
    assert int(resp.headers["Retry-After"]) >= 1
    assert "full" in resp.get_json()["error"]


def test_a_partly_refused_request_admits_none_of_its_rows(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    first = http.post("/submit", json={"model": "three", "input": {"value": 0, "size": 1}})
    assert first.status_code == 202
    resp = http.post("/v2/models/three/infer", json={"inputs": [value([[1.0]] * 3)]})
    assert resp.status_code == 429, resp.get_json()
    # Two rows fitted, the third did not: the two were cancelled, the first job stays.
    assert client.zrange(keys.bin("three", "only"), 0, -1) == [first.get_json()["id"]]


def test_priority_and_timeout_map_onto_carpools_priority_and_deadline(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    t0_ms = time.time() * 1000
    resp = http.post("/v2/models/tiny/infer", json={
        "id": "r1", "inputs": [value([[1.0]])],
        "parameters": {"priority": 1, "timeout": 150_000}})  # 1: Triton's highest; 150 ms
    assert resp.status_code == 504  # no worker serves tiny: the deadline passes
    (job_id,) = client.zrange(keys.bin("tiny", "only"), 0, -1)
    record = records.read(client, keys.job(job_id)) or {}
    assert record["priority"] == "9"  # carpool's highest
    # 150 ms after its admission, which came after t0 (no bound on how long after: a
    # busy machine may take any time to get the request to Redis).
    assert int(record["deadline"]) - int(record["t_admit"]) == 150
    assert int(record["deadline"]) >= t0_ms + 150 - 1


@pytest.mark.timeout(60)
def test_an_infer_waits_no_longer_than_max_wait_s_whatever_its_timeout(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    settings = settings_for(redis_url, key_prefix, tmp_path, CARPOOL_MAX_WAIT_S="6")
    with web_client(settings) as http:
        t0 = time.monotonic()
        resp = http.post("/v2/models/tiny/infer", json={  # a 60 s timeout; no worker
            "inputs": [value([[1.0]])], "parameters": {"timeout": 60_000_000}})
        assert resp.status_code == 504, resp.get_json()
        assert "within 6 s" in resp.get_json()["error"]
        assert time.monotonic() - t0 < 30


@pytest.mark.timeout(60)
def test_with_max_wait_s_0_an_infer_still_waits_its_floor(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    settings = settings_for(redis_url, key_prefix, tmp_path, CARPOOL_MAX_WAIT_S="0")
    with web_client(settings) as http:
        t0 = time.monotonic()
        resp = http.post("/v2/models/tiny/infer", json={"inputs": [value([[1.0]])]})
        assert resp.status_code == 504, resp.get_json()  # no worker serves tiny
        assert f"within {MIN_INFER_WAIT_S:g} s" in resp.get_json()["error"]
        assert time.monotonic() - t0 >= MIN_INFER_WAIT_S - 0.5  # not at once


def test_infer_needs_the_api_key_and_its_jobs_are_the_keys_own(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis,
        keys: Keys) -> None:
    with web_client(settings_for(redis_url, key_prefix, tmp_path,
                                 CARPOOL_API_KEYS=KEY)) as http:
        assert http.get("/v2/health/ready").status_code == 200  # health stays open
        body = {"inputs": [value([[1.0]])], "parameters": {"timeout": 50_000}}
        refused = http.post("/v2/models/tiny/infer", json=body)
        assert refused.status_code == 401 and "API key" in refused.get_json()["error"]
        wrong = http.post("/v2/models/tiny/infer", json=body,
                          headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.zcard(keys.bin("tiny", "only")) == 0
        ok = http.post("/v2/models/tiny/infer", json=body,
                       headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 504  # admitted, as the key's, and never served
        (job_id,) = client.zrange(keys.bin("tiny", "only"), 0, -1)
        assert (records.read(client, keys.job(job_id)) or {})["owner"] == api_key_digest(KEY)
        assert http.get(f"/result/{job_id}").status_code == 401  # another's: no key


def test_a_model_every_live_worker_refused_answers_503_and_is_not_ready(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    Registry(client, keys).publish("w1", [], {"synthetic": "no weights here"})
    resp = http.post(INFER, json=_GOOD)
    assert resp.status_code == 503 and "no weights here" in resp.get_json()["error"]
    ready = http.get("/v2/models/synthetic/ready")
    assert ready.status_code == 400 and "refused" in ready.get_json()["error"]
    assert client.zcard(keys.bin("synthetic", "small")) == 0


def test_a_served_model_is_ready_and_its_config_counts_the_workers(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    Registry(client, keys).publish("w1", ["synthetic"], {})
    assert http.get("/v2/models/synthetic/ready").get_json() == {"name": "synthetic",
                                                                  "ready": True}
    cfg = http.get("/v2/models/synthetic/config").get_json()
    assert cfg["instance_group"][0]["count"] == 1


def test_redis_lost_answers_503_with_retry_after_and_the_rows_job_ids(
        tmp_path: Path, key_prefix: str) -> None:
    with private_redis() as server, web_client(settings_for(server.url, key_prefix,
                                                            tmp_path)) as http:
        assert http.get("/v2/health/ready").status_code == 200
        server.kill()
        ready = http.get("/v2/health/ready")
        assert ready.status_code == 503 and isinstance(ready.get_json()["error"], str)
        resp = http.post(INFER, json={"inputs": [value([[1.0], [2.0]])]})
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == "2"
        assert "may have been admitted" in resp.get_json()["error"]
