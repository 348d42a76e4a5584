"""GET /openapi.json, each model's published input schema against what the web enforces,
and the tenancy parts (/models, /usage, usage, service tiers) against live answers."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.queue import Queue
from carpool.core.errors import InvalidInput
from carpool.core.input_limits import InputLimits
from carpool.core.jobs import Outcome
from carpool.intake import inputs
from tests.support.webtools import app_state, png, web_client, web_settings
from web.openapi.schemas import input_schema


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def test_openapi_document_describes_every_route_and_model(http: FlaskClient) -> None:
    doc = http.get("/openapi.json").get_json()
    assert doc["openapi"].startswith("3.0")
    assert set(doc["paths"]) >= {"/submit", "/submit/batch", "/result/{job_id}", "/models",
                                 "/healthz", "/readyz", "/openapi.json"}
    schemas = doc["components"]["schemas"]
    for model in ("synthetic", "tiny", "imgs", "texts"):
        assert f"Input_{model}" in schemas and f"Submit_{model}" in schemas
    assert "securitySchemes" not in doc["components"]
    job = schemas["Job"]["properties"]
    assert {"created_at", "started_at", "completed_at", "urls", "webhook"} <= set(job)
    assert job["webhook"]["properties"]["state"]["enum"] == ["pending", "retrying",
                                                             "delivered", "dead"]
    submit = schemas["Submit_synthetic"]["properties"]
    assert {"webhook", "webhook_events"} <= set(submit)
    assert {"/result/{job_id}/events", "/events"} <= set(doc["paths"])


EXAMPLES: list[tuple[str, Any]] = [
    ("synthetic", {"value": {"any": [1, None]}, "size": 0}),
    ("synthetic", {"value": 1, "size": 1024}),
    ("synthetic", {"value": 1, "size": 1025}),
    ("synthetic", {"value": 1, "size": -1}),
    ("synthetic", {"value": 1, "size": "3"}),
    ("synthetic", {"value": 1, "size": 3, "extra": 1}),
    ("synthetic", {"size": 3}),
    ("synthetic", [1, 2]),
    ("texts", {"text": "hello\tworld\n"}),
    ("texts", {"text": ""}),
    ("texts", {"text": "x" * 1001}),
    ("texts", {"text": "nul\u0000inside"}),
    ("texts", {"text": "bell\u0007"}),
    ("texts", {"text": "c1\u0085control"}),
    ("texts", {"text": 7}),
    ("imgs", {"image_b64": base64.b64encode(png(8, 8)).decode()}),
    ("imgs", {"image_b64": 5}),
    ("imgs", {"image_b64": ""}),
]


@pytest.mark.parametrize(("model", "raw"), EXAMPLES)
def test_the_published_schema_and_the_validator_agree(
        http: FlaskClient, model: str, raw: Any) -> None:
    settings = http.application.extensions["carpool"].settings
    spec = settings.catalogue.get(model)
    schema_ok = jsonschema.Draft4Validator(input_schema(spec)).is_valid(raw)
    try:
        inputs.prepare(spec, raw, InputLimits())
        web_ok = True
    except InvalidInput:
        web_ok = False
    assert schema_ok == web_ok


def test_text_with_a_control_character_answers_400_naming_it(http: FlaskClient) -> None:
    resp = http.post("/submit", json={"model": "texts", "input": {"text": "ab\u0000c"}})
    assert resp.status_code == 400
    assert "U+0000 at position 2" in resp.get_json()["error"]["message"]


def test_error_messages_never_echo_a_whole_body(http: FlaskClient) -> None:
    many = {f"key-{i}-{'x' * 100}": i for i in range(200)}
    resp = http.post("/submit", json={"model": "synthetic", "input": {"value": 1, "size": 1,
                                                                      **many}})
    assert resp.status_code == 400
    assert len(resp.get_data()) < 1000 and "and 195 more" in resp.get_json()["error"]["message"]
    resp = http.post("/submit", json={"model": "m" * 100_000, "input": {}})
    assert resp.status_code == 404 and len(resp.get_data()) < 1000


FLEX = "flex-key-0123456789abcdef0123"
OPS = "ops-key-0123456789abcdef01234"


def test_the_tenancy_parts_are_described_and_live_answers_match_them(
        redis_url: str, key_prefix: str, tmp_path: Path, queue: Queue) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{FLEX} tier=flex\n{OPS} admin tier=priority\n")
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_API_KEYS_FILE=str(keys))
    with web_client(settings) as http:
        doc = http.get("/openapi.json").get_json()
        paths, schemas = doc["paths"], doc["components"]["schemas"]
        usage = paths["/usage"]["get"]
        assert [p["name"] for p in usage["parameters"]] == ["hours", "from", "to"]
        assert set(usage["responses"]) >= {"200", "400", "401"}
        usage_200 = usage["responses"]["200"]["content"]["application/json"]["schema"]
        assert set(usage_200["properties"]["usage"]["items"]["required"]) == {
            "key", "model", "jobs", "device_ms", "queue_ms", "refused"}
        models_200 = paths["/models"]["get"]["responses"]["200"]["content"][
            "application/json"]["schema"]
        by_tier = models_200["properties"]["models"]["items"]["properties"]["refused_by_tier"]
        assert set(by_tier["required"]) == {"priority", "default", "flex"}
        assert set(schemas["Job"]["properties"]["usage"]["properties"]) == {"device_ms",
                                                                            "queue_ms"}
        embed, bulk = paths["/v1/embeddings"]["post"], paths["/v1/batches"]["post"]
        for body in (schemas["Submit_tiny"], schemas["Batch_tiny"],
                     embed["requestBody"]["content"]["application/json"]["schema"],
                     bulk["requestBody"]["content"]["application/json"]["schema"]):
            assert body["properties"]["service_tier"]["enum"] == ["flex", "default",
                                                                  "priority", "auto"]
        for op in (paths["/submit"]["post"], paths["/submit/batch"]["post"], embed, bulk):
            assert "X-Service-Tier" in [p["name"] for p in op["parameters"]]
        assert "quota_exceeded" in paths["/submit"]["post"]["responses"]["429"]["description"]

        # Live answers, with a refusal, a completed job and a usage row, match the schemas.
        flex = {"Authorization": f"Bearer {FLEX}"}
        codes = [http.post("/submit", json={"model": "tiny", "input": {"value": 0, "size": 1}},
                           headers=flex).status_code for _ in range(2)]
        assert codes == [202, 429]  # flex fills half of tiny's 2
        spec = app_state(http).settings.catalogue.get("tiny")
        claim = queue.claim(spec, "only", 1, lease_ms=30_000, token="t", worker="w")
        queue.complete(spec, claim, [Outcome(j.id, result=1, device_ms=2.0) for j in claim.jobs],
                       {"size": 1})
        job = http.get(f"/result/{claim.jobs[0].id}", headers=flex).get_json()
        jsonschema.validate(job["usage"], schemas["Job"]["properties"]["usage"])
        listing = http.get("/models").get_json()
        jsonschema.validate(listing, models_200)
        seen = http.get("/usage?hours=1", headers={"Authorization": f"Bearer {OPS}"}).get_json()
        jsonschema.validate(seen, usage_200)
        assert [(r["jobs"], r["refused"]) for r in seen["usage"]] == [(1, 1)]
