"""Batch webhooks on real Redis: the URL checked at create (a 400 with a message, nothing
made), and a batch's end recorded in the batch outbox in the same MULTI, once."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.bulkdb import BulkDb
from carpool.backend.keys import BULK_HOOK_TAG, Keys
from carpool.backend.outbox import DEAD, DELIVERED, Delivery, Event, Outbox
from carpool.core.bulk import BulkStatus
from carpool.core.wire import Family
from tests.support.bulk import embedding_lines
from tests.support.webtools import web_client, web_settings

KEY = "k" * 30
AUTH = {"Authorization": f"Bearer {KEY}"}
HOOK = "https://hooks.example.com/batches"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[FlaskClient]:
    settings = web_settings(redis_url, key_prefix, tmp_path,
                            CARPOOL_FILES_DIR=str(tmp_path / "files"), CARPOOL_API_KEYS=KEY)
    with web_client(settings) as c:
        yield c


def create(http: FlaskClient, webhook: Any) -> Any:
    made = http.post("/v1/files", headers=AUTH, content_type="multipart/form-data",
                     data={"purpose": "batch",
                           "file": (io.BytesIO(embedding_lines(1, model="texts")), "a")})
    body = {"input_file_id": made.get_json()["id"], "endpoint": "/v1/embeddings",
            "completion_window": "24h", "webhook": webhook}
    return http.post("/v1/batches", headers=AUTH, json=body)


@pytest.mark.parametrize(("webhook", "says"), [
    ("http://127.0.0.1/x", "loopback"),
    ("http://10.0.0.7/x", "private"),
    ("http://[::ffff:127.0.0.1]/x", "loopback"),
    ("http://2130706433/x", "loopback"),
    ("http://169.254.169.254/latest", "metadata"),
    ("http://localhost:9000/x", "this host"),
    ("http://metadata.google.internal/x", "metadata"),
    ("ftp://hooks.example.com/x", "scheme"),
    ("https://user:pw@hooks.example.com/x", "credentials"),
    ("https://hooks.example.com/a b", "spaces"),
    ("https://hooks.example.com/\u00e9", "ASCII"),
    ("https://hooks.example.com/" + "a" * 5000, "at most 2048"),
    ("https://hooks.example.com:99999/x", "not a valid URL"),
    ("https:///x", "no host"),
    (7, "must be a string"),
    (["https://hooks.example.com"], "must be a string"),
    ({"url": HOOK}, "must be a string"),
])
def test_a_refused_webhook_url_answers_400_and_makes_no_batch(
        http: FlaskClient, webhook: Any, says: str) -> None:
    resp = create(http, webhook)
    assert resp.status_code == 400, resp.get_json()
    assert says in resp.get_json()["error"]["message"]
    assert http.get("/v1/batches", headers=AUTH).get_json()["data"] == []


def test_a_batch_with_a_webhook_shows_it_pending_and_null_without(http: FlaskClient) -> None:
    made = create(http, HOOK)
    assert made.status_code == 200, made.get_json()
    assert made.get_json()["carpool"]["webhook"] == HOOK
    shown = http.get(f"/v1/batches/{made.get_json()['id']}", headers=AUTH).get_json()
    assert shown["carpool"]["webhook_delivery"] == {
        "state": "pending", "attempts": 0, "last_status": None, "last_error": None}
    bare = http.post("/v1/batches", headers=AUTH, json={
        "input_file_id": made.get_json()["input_file_id"], "endpoint": "/v1/embeddings",
        "completion_window": "24h"})
    assert bare.get_json()["carpool"]["webhook"] is None


def _batch(db: BulkDb, batch_id: str, webhook: str) -> None:
    db.add_bulk({"id": batch_id, "owner": "own", "status": "in_progress",
                  "webhook": webhook}, 3600)


def _events(outbox: Outbox) -> list[Event]:
    return list(outbox.take(BULK_HOOK_TAG, 100, 60_000).events)


@pytest.mark.parametrize(("final", "event"), [
    ("completed", "batch.completed"), ("failed", "batch.failed"),
    ("expired", "batch.expired"), ("cancelled", "batch.cancelled")])
def test_a_final_move_records_its_event_once_in_the_batch_outbox(
        client: redis.Redis, keys: Keys, final: str, event: str) -> None:
    db, outbox = BulkDb(client, keys), Outbox(client, keys)
    _batch(db, "batch_a", HOOK)
    assert db.move("batch_a", (BulkStatus.IN_PROGRESS,), BulkStatus(final))
    # the second move is refused
    assert not db.move("batch_a", (BulkStatus.IN_PROGRESS,), BulkStatus(final))
    got = _events(outbox)
    assert [(e.job_id, e.event, e.owner, e.url, e.webhook_id, e.family) for e in got] == [
        ("batch_a", event, "own", HOOK, f"batch_a.{event}", Family.BULK)]
    assert client.llen(keys.hook_wake(BULK_HOOK_TAG)) == 1
    # In the batches' own slot, so the MULTI holds on a cluster.
    assert keys.outbox(BULK_HOOK_TAG).startswith("{" + keys.prefix + "}")


def test_no_event_without_a_webhook_or_before_the_end(client: redis.Redis, keys: Keys) -> None:
    db, outbox = BulkDb(client, keys), Outbox(client, keys)
    _batch(db, "batch_b", HOOK)
    assert db.move("batch_b", (BulkStatus.IN_PROGRESS,), BulkStatus.FINALIZING)
    _batch(db, "batch_c", "")
    assert db.move("batch_c", (BulkStatus.IN_PROGRESS,), BulkStatus.COMPLETED)
    assert outbox.waiting([BULK_HOOK_TAG]) == 0


def test_a_batch_event_settles_in_the_batch_outbox(client: redis.Redis, keys: Keys) -> None:
    db, outbox = BulkDb(client, keys), Outbox(client, keys)
    _batch(db, "batch_d", HOOK)
    db.move("batch_d", (BulkStatus.IN_PROGRESS,), BulkStatus.COMPLETED)
    (event,) = _events(outbox)
    assert outbox.settle(event, DELIVERED, Delivery(DELIVERED, 1, 200, None, event.t_ms))
    assert outbox.waiting([BULK_HOOK_TAG]) == 0
    state = client.hget(keys.hook_state("batch_d", BULK_HOOK_TAG), "batch.completed")
    assert state is not None and '"delivered"' in str(state)


def test_a_dead_batch_event_is_listed_with_the_dead_letters(client: redis.Redis,
                                                           keys: Keys) -> None:
    db, outbox = BulkDb(client, keys), Outbox(client, keys)
    _batch(db, "batch_e", HOOK)
    db.move("batch_e", (BulkStatus.IN_PROGRESS,), BulkStatus("expired"))
    (event,) = _events(outbox)
    assert outbox.settle(event, DEAD, Delivery(DEAD, 3, 500, "HTTP 500", event.t_ms))
    (dead,) = outbox.dead([BULK_HOOK_TAG], 10)
    assert (dead["id"], dead["event"], dead["state"]) == ("batch_e", "batch.expired", DEAD)
    assert db.deliveries("batch_e")["batch.expired"].state == DEAD
