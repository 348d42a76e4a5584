"""GET /usage: a key's own usage, an admin key's view of all, the window's checks
(Flask app, real Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.queue import Queue
from carpool.backend.usage import current_hour, key_label
from carpool.core.jobs import Outcome
from carpool.core.settings import api_key_digest
from tests.support.webtools import app_state, web_client, web_settings

ALICE = "alice-key-0123456789abcdef01"
BOB = "bob-key-0123456789abcdef0123"
OPS = "ops-key-0123456789abcdef01234"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    keys = tmp_path / "keys"
    keys.write_text(f"{ALICE}\n{BOB}\n{OPS} admin\n")
    settings = web_settings(redis_url, key_prefix, tmp_path,
                            CARPOOL_API_KEYS_FILE=str(keys))
    with web_client(settings) as c:
        yield c


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def run_jobs(http: FlaskClient, queue: Queue, device_ms: float) -> list[str]:
    """Claim and complete every queued job of the small bin, each costing ``device_ms``."""
    spec = app_state(http).settings.catalogue.get("synthetic")
    claim = queue.claim(spec, "small", 1000, lease_ms=30_000, token=uuid.uuid4().hex,
                        worker="w")
    queue.complete(spec, claim, [Outcome(j.id, result=1, device_ms=device_ms)
                                 for j in claim.jobs], {"size": len(claim.jobs)})
    return [j.id for j in claim.jobs]


def test_a_key_sees_its_own_usage_and_an_admin_key_sees_every_keys(
        http: FlaskClient, queue: Queue) -> None:
    for key in (ALICE, ALICE, BOB):
        resp = http.post("/submit", json={"model": "synthetic", "input": {"value": 1, "size": 1}},
                         headers=as_(key))
        assert resp.status_code in (200, 202), resp.get_json()
    ids = run_jobs(http, queue, device_ms=1.5)
    docs = [http.get(f"/result/{i}", headers=as_(k)).get_json()
            for i, k in zip(ids, (ALICE, ALICE, BOB), strict=True)]
    assert [d["usage"]["device_ms"] for d in docs] == [1.5, 1.5, 1.5]
    own = http.get("/usage", headers=as_(ALICE)).get_json()
    alice_queue_ms = sum(d["usage"]["queue_ms"] for d in docs[:2])
    assert own["keys"] == "own"
    assert own["usage"] == [{"key": key_label(api_key_digest(ALICE)), "model": "synthetic",
                             "jobs": 2, "device_ms": 3.0, "queue_ms": alice_queue_ms,
                             "refused": 0}]
    everyone = http.get("/usage?hours=1", headers=as_(OPS)).get_json()
    assert everyone["keys"] == "all"
    assert {r["key"]: r["jobs"] for r in everyone["usage"]} == {
        key_label(api_key_digest(ALICE)): 2, key_label(api_key_digest(BOB)): 1}
    assert everyone["total"]["device_ms"] == 4.5
    assert http.get("/usage").status_code == 401


@pytest.mark.parametrize("query, says", [
    ("hours=0", "hours must be a whole number"), ("hours=abc", "hours must be"),
    ("hours=100000", "hours must be"), ("hours=%C2%B2", "hours must be"),  # "²"
    ("hours=" + "9" * 5000, "hours must be"), ("from=yesterday", "RFC 3339"),
    ("hours=2&from=2026-01-01T00:00:00Z", "not both"),
    ("from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "from must not be after to"),
    ("from=2020-01-01T00:00:00Z&to=2026-01-01T00:00:00Z", "spans"),
    # Outside the hours kept; the first two once answered 500 (the year 10000; the year 0).
    ("from=9999-12-31T23:59:59Z&to=9999-12-31T23:59:59Z", "must fall in the hours usage is kept"),
    ("from=0001-01-01T00:00:00%2B14:00&to=0001-01-01T00:00:00Z", "must fall in the hours"),
    ("from=0001-01-01T00:00:00Z&to=0001-01-01T00:00:00Z", "must fall in the hours"),
    ("to=2000-01-01T00:00:00Z", "from (by default 23 hours before to) must fall in"),
])
def test_a_bad_window_answers_400_saying_what_to_write(
        http: FlaskClient, query: str, says: str) -> None:
    resp = http.get(f"/usage?{query}", headers=as_(ALICE))
    assert resp.status_code == 400
    assert says in resp.get_json()["error"]["message"]


def test_a_from_to_window_names_whole_hours_and_may_end_ahead_of_now(http: FlaskClient) -> None:
    hour = datetime.fromtimestamp(current_hour() * 3600, UTC)
    first, last = hour - timedelta(hours=2), hour + timedelta(hours=3)
    at = "%Y-%m-%dT%H:%M:%S"
    doc = http.get(f"/usage?from={first + timedelta(minutes=30):{at}}Z"
                   f"&to={last + timedelta(minutes=5):{at}}%2B00:00", headers=as_(ALICE))
    assert doc.status_code == 200, doc.get_json()
    assert (doc.get_json()["from"], doc.get_json()["to"]) == (
        f"{first:{at}}.000Z", f"{last + timedelta(hours=1):{at}}.000Z")
    assert doc.get_json()["usage"] == []


FLEX = "flex-key-0123456789abcdef012"


@pytest.fixture
def tiered(redis_url: str, key_prefix: str, tmp_path: Path,
           client: redis.Redis) -> Iterator[FlaskClient]:
    keys = tmp_path / "keys"
    keys.write_text(f"{ALICE}\n{FLEX} tier=flex\n{OPS} tier=priority\n")
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_API_KEYS_FILE=str(keys))
    with web_client(settings) as c:
        yield c


@pytest.mark.parametrize("key, body, headers, says", [
    (ALICE, {"service_tier": "gold"}, {}, "service_tier must be one of flex, default, priority"),
    (ALICE, {"service_tier": "priority"}, {}, "above this API key's tier 'default'"),
    (FLEX, {"service_tier": "default"}, {}, "above this API key's tier 'flex'"),
    (ALICE, {}, {"X-Service-Tier": "priority"}, "above this API key's tier"),
    (ALICE, {"service_tier": 3}, {}, "service_tier must be one of"),
])
def test_an_unknown_tier_or_one_above_the_keys_is_a_400(
        tiered: FlaskClient, key: str, body: dict[str, object], headers: dict[str, str],
        says: str) -> None:
    resp = tiered.post("/submit", json={"model": "synthetic", "input": {"value": 1, "size": 1},
                                        **body}, headers={**as_(key), **headers})
    assert resp.status_code == 400, resp.get_json()
    assert says in resp.get_json()["error"]["message"]


def test_a_key_may_ask_for_a_lower_tier(tiered: FlaskClient) -> None:
    for key, tier in ((OPS, "flex"), (OPS, "default"), (ALICE, "flex"), (FLEX, "flex")):
        resp = tiered.post("/submit", json={"model": "synthetic", "service_tier": tier,
                                            "input": {"value": 1, "size": 1}}, headers=as_(key))
        assert resp.status_code == 202, resp.get_json()
