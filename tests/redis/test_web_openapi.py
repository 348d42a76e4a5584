"""GET /openapi.json, and each model's published input schema against what the web enforces."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from flask.testing import FlaskClient

from carpool.core.errors import InvalidInput
from carpool.core.input_limits import InputLimits
from carpool.intake import inputs
from tests.support.webtools import png, web_client, web_settings
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
