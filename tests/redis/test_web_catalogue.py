"""GET /models (with each model's refusals by service tier), /healthz and /readyz."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from tests.support.webtools import web_client, web_settings

FLEX = "flex-key-0123456789abcdef0123"
PRIO = "prio-key-0123456789abcdef0123"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def model(http: FlaskClient, name: str) -> dict[str, Any]:
    resp = http.get("/models")
    assert resp.status_code == 200
    found = [m for m in resp.get_json()["models"] if m["name"] == name]
    assert len(found) == 1
    return dict(found[0])


def depths(http: FlaskClient, name: str) -> dict[str, int]:
    return {b["name"]: b["depth"] for b in model(http, name)["bins"]}


def test_models_lists_each_models_bins_and_limits(http: FlaskClient) -> None:
    synthetic = model(http, "synthetic")
    assert (synthetic["kind"], synthetic["measure"]) == ("synthetic", "size")
    assert synthetic["bins"][0] == {"name": "small", "max_size": 64, "max_batch": 32,
                                    "max_wait_ms": 20, "max_depth": 5000, "depth": 0}
    assert synthetic["limits"] == {"max_input_bytes": 64 << 10}
    assert model(http, "tiny")["scheduling"] == {
        "default_deadline_ms": 4000, "max_deadline_ms": 60000, "priorities": [0, 9],
        "priority_step_ms": 1000, "p99_target_ms": 0}
    imgs = model(http, "imgs")
    assert imgs["limits"]["max_side"] == 4096
    assert imgs["limits"]["formats"] == ["JPEG", "PNG", "WEBP"]
    assert model(http, "texts")["limits"]["max_chars"] == 1000


def test_models_shows_queue_depths_that_move(http: FlaskClient) -> None:
    ids = [http.post("/submit", json={"model": "synthetic", "input": {"value": 0, "size": s}}
                     ).get_json()["id"] for s in (1, 2, 100)]
    assert depths(http, "synthetic") == {"small": 2, "medium": 1, "large": 0}
    http.delete(f"/result/{ids[0]}")
    assert depths(http, "synthetic") == {"small": 1, "medium": 1, "large": 0}


def test_models_shows_refusals_by_the_tier_each_request_ran_in(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{FLEX} tier=flex\n{PRIO} tier=priority\n")
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_API_KEYS_FILE=str(keys))

    def submit(key: str, **extra: Any) -> int:
        headers = {"Authorization": f"Bearer {key}", **extra.pop("headers", {})}
        return http.post("/submit", json={"model": "tiny", "input": {"value": 0, "size": 1},
                                          **extra}, headers=headers).status_code

    with web_client(settings) as http:
        prio = {"Authorization": f"Bearer {PRIO}"}
        assert model(http, "tiny")["refused_by_tier"] == {"priority": 0, "default": 0, "flex": 0}
        # tiny holds 2: flex may fill 1 of them, default 1 (a priority key exists), priority 2.
        assert submit(PRIO, headers={"X-Service-Tier": "flex"}) == 202
        assert submit(FLEX) == 429  # its tier's part is full
        assert submit(PRIO, headers={"X-Service-Tier": "flex"}) == 429  # the tier it asked for
        assert submit(PRIO) == 202
        assert submit(PRIO) == 429  # bin_full
        assert submit(PRIO, service_tier="default") == 429
        batch = http.post("/submit/batch", headers=prio, json={
            "model": "tiny", "inputs": [{"value": 0, "size": 1}] * 2, "service_tier": "flex"})
        assert [j["status"] for j in batch.get_json()["jobs"]] == [429, 429]
        assert model(http, "tiny")["refused_by_tier"] == {"priority": 1, "default": 1, "flex": 4}
        assert model(http, "synthetic")["refused_by_tier"] == {
            "priority": 0, "default": 0, "flex": 0}


def test_healthz_and_readyz_answer_200_when_redis_answers(http: FlaskClient) -> None:
    assert http.get("/healthz").get_json() == {"status": "ok"}
    assert http.get("/readyz").get_json() == {"status": "ready"}


def test_unknown_route_and_wrong_method_answer_json_errors(http: FlaskClient) -> None:
    missing = http.get("/nope")
    assert (missing.status_code, missing.get_json()["error"]["code"]) == (404, "not_found")
    wrong = http.get("/submit")
    assert (wrong.status_code, wrong.get_json()["error"]["code"]) == (405, "method_not_allowed")
    assert "POST" in wrong.headers["Allow"]
