"""The lean routes (web/common/lean.py): ``POST /submit`` with JSON, ``GET /result/<id>``,
``/v2`` infer and ``/v1/embeddings`` answered in front of Flask's dispatch. They answer
what Flask's dispatch answers (status, headers, body; the same counts in /metrics) for a
corpus of good, bad and hostile requests, with API keys on; and they do skip it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import request
from flask.testing import FlaskClient

from carpool.core.jobs import new_job_id
from carpool.core.settings import Settings, load_settings
from tests.conftest import make_env
from tests.support.promtext import Scrape
from tests.support.webtools import CATALOGUE_TOML, MAX_BODY_BYTES, web_client
from web import create_app
from web.common.lean import LeanRoutes
from web.jobs import routes as job_routes

KEY = "k-lean-test-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}
GOOD = json.dumps({"model": "synthetic", "input": {"value": 1, "size": 2}}).encode()
TINY = json.dumps({"model": "tiny", "input": {"value": 1, "size": 2}}).encode()
INFER = "/v2/models/synthetic/infer"
EMBED = "/v1/embeddings"
GOOD_V2 = json.dumps({"inputs": [{"name": "VALUE", "datatype": "FP32", "shape": [1, 2],
                                  "data": [1.0, 2.0]}]}).encode()
UNKNOWN_ID = new_job_id("synthetic")
#: Fields whose values differ between two runs of the same request.
FRESH = frozenset({"id", "result_url", "Location"})

#: In order: the tiny model's bin holds two, so its third submit is refused.
CORPUS: list[tuple[str, str, str, bytes, dict[str, str]]] = [
    ("submit", "POST", "/submit", GOOD, JSON),
    ("submit-waits", "POST", "/submit?wait=0.05", GOOD, JSON),
    ("submit-prefer", "POST", "/submit", GOOD, {**JSON, "Prefer": "wait=1"}),
    ("prefer-not-whole", "POST", "/submit", GOOD, {**JSON, "Prefer": "wait=0.05"}),
    ("tiny-1", "POST", "/submit", TINY, JSON),
    ("tiny-2", "POST", "/submit", TINY, JSON),
    ("tiny-full", "POST", "/submit", TINY, JSON),
    ("no-key", "POST", "/submit", GOOD, {"Content-Type": "application/json"}),
    ("wrong-key", "POST", "/submit", GOOD,
     {"Content-Type": "application/json", "X-API-Key": "nope"}),
    ("not-json", "POST", "/submit", b"{", JSON),
    ("not-an-object", "POST", "/submit", b"[1, 2]", JSON),
    ("deep", "POST", "/submit", b"[" * 5000, JSON),
    ("unknown-model", "POST", "/submit", b'{"model": "nope", "input": {}}', JSON),
    ("bad-input", "POST", "/submit", b'{"model": "synthetic", "input": "x"}', JSON),
    ("wait-nan", "POST", "/submit?wait=nan", GOOD, JSON),
    ("wait-negative", "POST", "/submit?wait=-1", GOOD, JSON),
    ("timeout-zero", "POST", "/submit", GOOD, {**JSON, "X-Carpool-Timeout": "0"}),
    ("idempotency-empty", "POST", "/submit", GOOD, {**JSON, "Idempotency-Key": ""}),
    ("gzip", "POST", "/submit", b"\x1f\x8b\x08\x00", {**JSON, "Content-Encoding": "gzip"}),
    ("too-large", "POST", "/submit", b'{"input": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}',
     JSON),
    ("text-plain", "POST", "/submit", b"hello", {**AUTH, "Content-Type": "text/plain"}),
    ("form-no-file", "POST", "/submit", b"--b--\r\n",
     {**AUTH, "Content-Type": "multipart/form-data; boundary=b"}),
    ("result-not-an-id", "GET", "/result/nope", b"", AUTH),
    ("result-unknown", "GET", f"/result/{UNKNOWN_ID}", b"", AUTH),
    ("result-no-key", "GET", f"/result/{UNKNOWN_ID}", b"", {}),
    ("result-wait-bad", "GET", f"/result/{UNKNOWN_ID}?wait=x", b"", AUTH),
    ("result-trailing-slash", "GET", f"/result/{UNKNOWN_ID}/", b"", AUTH),
    ("result-not-ascii", "GET", "/result/\u00e9t\u00e9", b"", AUTH),
    ("websocket", "POST", "/submit", GOOD,
     {**JSON, "Connection": "Upgrade", "Upgrade": "websocket"}),
    ("result-websocket", "GET", f"/result/{UNKNOWN_ID}", b"",
     {**AUTH, "Connection": "Upgrade", "Upgrade": "websocket"}),
    ("infer-malformed", "POST", INFER, b"{", JSON),
    ("infer-no-key", "POST", INFER, GOOD_V2, {"Content-Type": "application/json"}),
    ("infer-unknown-model", "POST", "/v2/models/nope/infer", GOOD_V2, JSON),
    ("infer-unknown-version", "POST", "/v2/models/synthetic/versions/9/infer", GOOD_V2, JSON),
    ("infer-bad-tensor", "POST", INFER, b'{"inputs": [{"name": "VALUE"}]}', JSON),
    ("infer-timeout-bad", "POST", INFER, GOOD_V2, {**JSON, "X-Carpool-Timeout": "-1"}),
    ("embed-malformed", "POST", EMBED, b"{", JSON),
    ("embed-no-key", "POST", EMBED, b'{"model": "texts", "input": "a"}',
     {"Content-Type": "application/json"}),
    ("embed-not-a-text-model", "POST", EMBED, b'{"model": "synthetic", "input": "a"}', JSON),
    ("embed-input-a-number", "POST", EMBED, b'{"model": "texts", "input": 5}', JSON),
    ("embed-too-many", "POST", EMBED,
     json.dumps({"model": "texts", "input": ["a"] * 3000}).encode(), JSON),
    ("embed-unknown-model", "POST", EMBED, b'{"model": "nope", "input": "a"}', JSON),
    ("embed-tier-bad", "POST", EMBED, b'{"model": "texts", "input": "a"}',
     {**JSON, "X-Service-Tier": "platinum"}),
]

CASES = {name: (method, path, body, headers) for name, method, path, body, headers in CORPUS}


def settings_of(redis_url: str, prefix: str, tmp_path: Path) -> Settings:
    config = tmp_path / "catalogue.toml"
    config.write_text(CATALOGUE_TOML)
    return load_settings(make_env(redis_url, prefix, CARPOOL_CONFIG=str(config),
                                  CARPOOL_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
                                  CARPOOL_API_KEYS=KEY))


@pytest.fixture
def apps(redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis
         ) -> Iterator[tuple[FlaskClient, FlaskClient]]:
    """The lean app and Flask's alone, each on its own keys (the same state for both)."""
    with web_client(settings_of(redis_url, f"{key_prefix}-lean", tmp_path)) as lean, \
            web_client(settings_of(redis_url, f"{key_prefix}-flask", tmp_path),
                       lean_routes=False) as flask:
        yield lean, flask


def answer(http: FlaskClient, method: str, path: str, body: bytes,
           headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], Any]:
    """Status, headers and body, with the values that differ per run masked."""
    resp = http.open(path, method=method, data=body, headers=headers)
    got = [(k, "<fresh>" if k in FRESH else v) for k, v in resp.headers.items()]
    try:
        doc = json.loads(resp.get_data())
    except ValueError:
        return resp.status_code, got, resp.get_data()
    if isinstance(doc, dict):
        doc = {k: "<fresh>" if k in FRESH else v for k, v in doc.items()}
    return resp.status_code, got, doc


def test_every_request_is_answered_as_flasks_dispatch_answers_it(
        apps: tuple[FlaskClient, FlaskClient]) -> None:
    lean, flask = apps
    for name, method, path, body, headers in CORPUS:
        ours = answer(lean, method, path, body, headers)
        assert ours == answer(flask, method, path, body, headers), name
        assert ours[0] != 500, name
    assert answer(lean, *CASES["tiny-full"])[0] == 429  # the bin full: really refused


def test_metrics_count_as_flasks_dispatch_counts(apps: tuple[FlaskClient, FlaskClient]) -> None:
    lean, flask = apps
    for _, method, path, body, headers in CORPUS:
        lean.open(path, method=method, data=body, headers=headers)
        flask.open(path, method=method, data=body, headers=headers)
    ours, theirs = (Scrape(http.get("/metrics", headers=AUTH).get_data(as_text=True))
                    for http in (lean, flask))
    for family in ("carpool_jobs_submitted_total", "carpool_jobs_rejected_total",
                   "carpool_http_requests_total", "carpool_http_request_duration_seconds_count"):
        mine = sorted((sorted(ls.items()), v) for n, ls, v in ours.samples if n == family)
        assert mine == sorted((sorted(ls.items()), v)
                              for n, ls, v in theirs.samples if n == family), family
    assert ours.value("carpool_jobs_rejected_total", model="tiny") == 1
    assert ours.value("carpool_http_requests_total", route="/submit", status="202") == 5


def test_the_routes_every_job_takes_skip_flasks_dispatch(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis) -> None:
    app = create_app(settings_of(redis_url, key_prefix, tmp_path))
    dispatched: list[str | None] = []
    app.before_request(lambda: dispatched.append(request.endpoint))
    http = app.test_client()
    try:
        job_id = http.post("/submit", data=GOOD, headers=JSON).get_json()["id"]
        assert http.get(f"/result/{job_id}", headers=AUTH).status_code == 200
        assert http.post(INFER, data=b"{", headers=JSON).status_code == 400
        assert http.post(EMBED, data=b"{", headers=JSON).status_code == 400
        assert dispatched == []
        assert http.post("/submit", data=b"x", headers={**AUTH, "Content-Type": "text/plain"}
                         ).status_code == 415
        assert http.head(f"/result/{job_id}", headers=AUTH).status_code == 200
        assert dispatched == ["carpool.submit", "carpool.result"]
    finally:
        app.extensions["carpool"].close()


def test_an_app_with_a_hook_the_lean_routes_would_skip_does_not_start(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis) -> None:
    app = create_app(settings_of(redis_url, key_prefix, tmp_path), lean_routes=False)
    try:
        LeanRoutes(app, job_routes.LEAN_ROUTES)  # the app's own hooks: done there
        app.before_request(lambda: None)
        with pytest.raises(RuntimeError, match="before_request_funcs"):
            LeanRoutes(app, job_routes.LEAN_ROUTES)
    finally:
        app.extensions["carpool"].close()
