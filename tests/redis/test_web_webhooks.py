"""Webhooks at submit, over HTTP: every malformed or forbidden ``webhook`` and
``webhook_events`` is a 400 that says what to change (never a 500), on single, batch
and file submits; a good one is kept with the job, which shows its delivery."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.core.shards import shard
from tests.support.webtools import png, web_client, web_settings
from tests.unit.test_webhooks import BAD_URLS

JOB = {"model": "synthetic", "input": {"value": "v", "size": 3}}
GOOD = "https://example.com/hooks/carpool?src=test"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def refused(resp: Any) -> str:
    assert resp.status_code == 400, (resp.status_code, resp.get_data(as_text=True)[:300])
    return str(resp.get_json()["error"]["message"])


@pytest.mark.parametrize(("url", "says"), BAD_URLS)
def test_a_bad_webhook_url_is_a_400_naming_the_problem(http: FlaskClient, url: str,
                                                       says: str) -> None:
    assert says.lower() in refused(http.post("/submit", json={**JOB, "webhook": url})).lower()


@pytest.mark.parametrize("value", [1, 1.5, True, [], ["https://example.com"], {"u": 1},
                                   "x" * 100_000])
def test_a_webhook_of_the_wrong_type_or_size_is_a_400(http: FlaskClient, value: Any) -> None:
    assert "webhook" in refused(http.post("/submit", json={**JOB, "webhook": value}))


@pytest.mark.parametrize("events", ["done", [], ["finished"], [1], [None], [{}], ["done"] * 9,
                                    {"done": True}])
def test_bad_webhook_events_are_a_400_listing_the_allowed_ones(http: FlaskClient,
                                                               events: Any) -> None:
    body = {**JOB, "webhook": GOOD, "webhook_events": events}
    assert "running" in refused(http.post("/submit", json=body))


def test_webhook_events_without_a_webhook_are_a_400(http: FlaskClient) -> None:
    assert "needs a webhook" in refused(http.post("/submit", json={
        **JOB, "webhook_events": ["done"]}))


def test_a_batch_with_a_forbidden_webhook_admits_nothing(http: FlaskClient, client: redis.Redis,
                                                         keys: Keys) -> None:
    body = {"model": "synthetic", "inputs": [{"value": 1, "size": 1}] * 3,
            "webhook": "http://10.0.0.1/hook"}
    assert "private" in refused(http.post("/submit/batch", json=body))
    assert not list(client.scan_iter(match=keys.job_pattern(shard("synthetic"))))


def test_a_good_webhook_is_kept_with_each_job_and_shown_pending(http: FlaskClient,
                                                                client: redis.Redis,
                                                                keys: Keys) -> None:
    resp = http.post("/submit/batch", json={
        "model": "synthetic", "inputs": [{"value": i, "size": 1} for i in range(3)],
        "webhook": GOOD, "webhook_events": ["running", "done"]})
    assert resp.status_code == 202
    for entry in resp.get_json()["jobs"]:
        rec = records.read(client, keys.job(entry["id"]))
        assert rec is not None and rec["hook"] == f"rd {GOOD}"
        doc = http.get(f"/result/{entry['id']}").get_json()
        assert doc["webhook"] == {"state": "pending", "attempts": 0, "last_status": None,
                                  "last_error": None}
    plain = http.post("/submit", json=JOB).get_json()
    assert "webhook" not in http.get(f"/result/{plain['id']}").get_json()


def test_a_file_submit_takes_its_webhook_from_form_fields(http: FlaskClient,
                                                          client: redis.Redis,
                                                          keys: Keys) -> None:
    form = {"model": "imgs", "webhook": GOOD, "webhook_events": "done,failed"}
    resp = http.post("/submit", data={**form, "file": (io.BytesIO(png(64, 64)), "x.png")},
                     content_type="multipart/form-data")
    assert resp.status_code == 202, resp.get_data(as_text=True)
    rec = records.read(client, keys.job(resp.get_json()["id"]))
    assert rec is not None and rec["hook"] == f"df {GOOD}"
    bad = http.post("/submit", data={**form, "webhook": "file:///etc/passwd",
                                     "file": (io.BytesIO(png(64, 64)), "x.png")},
                    content_type="multipart/form-data")
    assert "scheme" in refused(bad)
