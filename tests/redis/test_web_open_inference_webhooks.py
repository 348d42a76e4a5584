"""Webhooks on ``POST /v2/models/{m}/infer`` (web/open_inference/model.py ``webhook_of``): the
request's ``parameters.webhook`` and ``parameters.webhook_events`` are checked as /submit checks
them, a bad or forbidden one is the protocol's 400 with nothing queued, and a good one is kept
with every row's job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.backend.outbox import Outbox
from carpool.core.shards import shard
from tests.redis.test_web_open_inference import settings_for
from tests.support.webtools import web_client, web_settings
from tests.unit.test_webhooks import BAD_URLS

GOOD = "https://example.com/hooks/carpool?src=v2"
#: No worker serves it here, so a short timeout answers 504 with the rows still queued.
SYNTHETIC = "/v2/models/synthetic/infer"


def rows(n: int) -> list[dict[str, Any]]:
    return [{"name": "VALUE", "datatype": "FP32", "shape": [n, 1], "data": [[1.0]] * n}]


def infer(http: FlaskClient, path: str, n: int = 1, **parameters: Any) -> Any:
    return http.post(path, json={"inputs": rows(n), "parameters": parameters})


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def refused(resp: Any) -> str:
    assert resp.status_code == 400, (resp.status_code, resp.get_data(as_text=True)[:300])
    error = resp.get_json()["error"]
    assert isinstance(error, str)  # the protocol's {"error": "<message>"}
    return error


def job_ids(client: redis.Redis, keys: Keys) -> list[str]:
    """Every synthetic job's id in Redis."""
    pattern = keys.job_pattern(shard("synthetic"))
    return [str(k).rpartition(":")[2] for k in client.scan_iter(match=pattern)]


def nothing_queued(client: redis.Redis, keys: Keys) -> bool:
    return job_ids(client, keys) == []


@pytest.mark.parametrize(("url", "says"), BAD_URLS)
def test_a_bad_or_forbidden_webhook_is_a_400_and_nothing_is_queued(
        http: FlaskClient, client: redis.Redis, keys: Keys, url: str, says: str) -> None:
    message = refused(infer(http, SYNTHETIC, n=2, webhook=url))
    assert says.lower() in message.lower() and "parameters" in message
    assert nothing_queued(client, keys)


@pytest.mark.parametrize("value", [1, 1.5, True, [], ["https://example.com"], {"u": 1},
                                   "x" * 100_000])
def test_a_webhook_of_the_wrong_type_or_size_is_a_400(http: FlaskClient, client: redis.Redis,
                                                      keys: Keys, value: Any) -> None:
    assert "webhook" in refused(infer(http, SYNTHETIC, webhook=value))
    assert nothing_queued(client, keys)


@pytest.mark.parametrize("events", ["", "finished", "done,,failed", "done;failed", 7, True,
                                    [], ["finished"], {"done": True}, "done," * 9])
def test_bad_webhook_events_are_a_400_listing_the_allowed_ones(
        http: FlaskClient, client: redis.Redis, keys: Keys, events: Any) -> None:
    assert "running" in refused(infer(http, SYNTHETIC, webhook=GOOD, webhook_events=events))
    assert nothing_queued(client, keys)


def test_webhook_events_without_a_webhook_are_a_400(http: FlaskClient) -> None:
    assert "needs a webhook" in refused(infer(http, SYNTHETIC, webhook_events="done"))


@pytest.mark.parametrize(("events", "letters"), [
    (None, "dfxc"), ("done,failed", "df"), (" running , done ", "rd"),
    (["running", "cancelled"], "rc")])
def test_a_good_webhook_is_kept_with_every_rows_job(
        http: FlaskClient, client: redis.Redis, keys: Keys, events: Any, letters: str) -> None:
    parameters: dict[str, Any] = {"webhook": GOOD, "timeout": 50_000}
    if events is not None:
        parameters["webhook_events"] = events
    resp = infer(http, SYNTHETIC, n=2, **parameters)
    assert resp.status_code == 504, resp.get_data(as_text=True)
    ids = job_ids(client, keys)
    assert len(ids) == 2 and all(i in resp.get_json()["error"] for i in ids)
    for job_id in ids:
        rec = records.read(client, keys.job(job_id))
        assert rec is not None and rec["hook"] == f"{letters} {GOOD}"
        assert http.get(f"/result/{job_id}").get_json()["webhook"]["state"] == "pending"


def test_a_partly_refused_request_with_a_webhook_queues_no_event_for_its_cancelled_rows(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis,
        keys: Keys) -> None:
    outbox = Outbox(client, keys)
    with web_client(settings_for(redis_url, key_prefix, tmp_path)) as http:
        first = http.post("/submit", json={"model": "three", "input": {"value": 0, "size": 1}})
        assert first.status_code == 202  # three holds 3: two of the request's rows fit
        resp = infer(http, "/v2/models/three/infer", n=3, webhook=GOOD,
                     webhook_events="done,cancelled")
        assert resp.status_code == 429, resp.get_json()
        assert client.zcard(keys.bin("three", "only")) == 1  # the two rows were cancelled
        assert outbox.waiting([shard("three")]) == 0
        # A client's own cancel still tells its webhook.
        job = http.post("/submit", json={"model": "three", "input": {"value": 0, "size": 1},
                                         "webhook": GOOD, "webhook_events": ["cancelled"]})
        assert http.delete(f"/result/{job.get_json()['id']}").status_code == 200
        assert outbox.waiting([shard("three")]) == 1
