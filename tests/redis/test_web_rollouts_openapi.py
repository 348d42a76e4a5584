"""The rollout calls in GET /openapi.json: PUT and DELETE /models/{name}/rollout and a
model's ``rollout`` in GET /models are described, and live answers (each change, the
rollback, their errors) match what the document says."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from flask.testing import FlaskClient

from carpool.core.settings import load_settings
from tests.conftest import make_env
from tests.support.webtools import web_client

VERSIONS_TOML = """
[models.synthetic.versions.2]
result_ttl_s = 120
[models.synthetic.versions.3]
result_ttl_s = 121
"""
PATH = "/models/{name}/rollout"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    config = tmp_path / "catalogue.toml"
    config.write_text(VERSIONS_TOML)
    with web_client(load_settings(make_env(redis_url, key_prefix,
                                           CARPOOL_CONFIG=str(config)))) as c:
        yield c


def json_schema(openapi: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema: ``nullable`` becomes a null type."""
    if isinstance(openapi, list):
        return [json_schema(s) for s in openapi]
    if not isinstance(openapi, dict):
        return openapi
    out = {k: json_schema(v) for k, v in openapi.items() if k != "nullable"}
    if openapi.get("nullable"):
        out["type"] = [openapi["type"], "null"]
    return out


def answer_schema(op: dict[str, Any], status: str, components: dict[str, Any]) -> Any:
    schema = op["responses"][status]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    return json_schema(schema)


def test_the_rollout_calls_are_described_and_live_answers_match_them(
        http: FlaskClient) -> None:
    doc = http.get("/openapi.json").get_json()
    ops, components = doc["paths"][PATH], doc["components"]["schemas"]
    assert set(ops) == {"parameters", "put", "delete"}
    assert set(ops["put"]["responses"]) >= {"200", "400", "403", "404", "409", "413"}
    assert set(ops["delete"]["responses"]) >= {"200", "400", "403", "404"}
    change = json_schema(ops["put"]["requestBody"]["content"]["application/json"]["schema"])
    models_200 = answer_schema(doc["paths"]["/models"]["get"], "200", components)

    for body in ({"version": "2", "percent": 100}, {"shadow": "3", "percent": 0},
                 {"retire": "1"}):
        jsonschema.validate(body, change)  # what the document allows the web takes
        answer = http.put("/models/synthetic/rollout", json=body)
        assert answer.status_code == 200, answer.get_json()
        jsonschema.validate(answer.get_json(), answer_schema(ops["put"], "200", components))
        listing = http.get("/models").get_json()
        assert any("rollout" in m for m in listing["models"])
        jsonschema.validate(listing, models_200)
    for body, status in (({"version": "2", "percent": 101}, "400"),
                         ({"retire": "2"}, "409")):  # jobs still go to 2
        with pytest.raises(jsonschema.ValidationError) if status == "400" else nullcontext():
            jsonschema.validate(body, change)
        refused = http.put("/models/synthetic/rollout", json=body)
        assert str(refused.status_code) == status
        jsonschema.validate(refused.get_json(), answer_schema(ops["put"], status, components))
    back = http.delete("/models/synthetic/rollout")
    assert back.status_code == 200
    jsonschema.validate(back.get_json(), answer_schema(ops["delete"], "200", components))
    unknown = http.delete("/models/nope/rollout")
    assert unknown.status_code == 404
    jsonschema.validate(unknown.get_json(), answer_schema(ops["delete"], "404", components))
