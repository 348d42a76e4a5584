"""Webhooks on a Redis Cluster: each model's outbox lives in its own slot, and one
dispatcher delivers the events of every shard (a wake thread per shard)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from carpool.backend.bulkdb import BulkDb
from carpool.backend.connection import connect
from carpool.backend.keys import BULK_HOOK_TAG, Keys, shard
from carpool.backend.outbox import Outbox
from carpool.core.bulk import BulkStatus
from tests.e2e.test_cluster import CATALOGUE, MODELS, env_for
from tests.support.hookstack import DEPLOY_SECRET
from tests.support.procs import start_dispatcher, start_web, start_worker
from tests.support.receiver import receiver
from tests.support.redisproc import RedisProc, close_cluster_client, private_cluster, private_redis


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisProc]]:
    with private_cluster() as nodes:
        yield nodes


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisProc]:
    with private_redis() as server:
        yield server


def test_every_shards_events_are_delivered_on_a_cluster(cluster: list[RedisProc],
                                                       broker: RedisProc, key_prefix: str,
                                                       tmp_path: Path) -> None:
    config = tmp_path / "catalogue.toml"
    config.write_text(CATALOGUE)
    env = {**env_for(cluster, broker, key_prefix, config),
           "CARPOOL_WEBHOOK_ALLOW_PRIVATE": "1", "CARPOOL_WEBHOOK_SECRET": DEPLOY_SECRET}
    client = connect(cluster[0].url, cluster=True)
    keys = Keys(key_prefix)
    outboxes = {int(client.get_node_from_key(keys.outbox(shard(m))).port)  # type: ignore[attr-defined]
                for m in MODELS}
    assert len(outboxes) > 1  # the outboxes live on more than one master
    with receiver() as rx, start_web(env) as base, start_worker(env), start_dispatcher(env):
        ids = []
        for m in MODELS:
            resp = httpx.post(f"{base}/submit", timeout=10, json={
                "model": m, "input": {"value": 1, "size": 1}, "webhook": f"{rx.url}/{m}",
                "webhook_events": ["running", "done"]})
            assert resp.status_code == 202, resp.text
            ids.append(resp.json()["id"])
        rx.wait_for_ids({f"{i}.{e}" for i in ids for e in ("running", "done")}, 90.0)
        for r in rx.all():
            assert Webhook(DEPLOY_SECRET).verify(r.body, r.headers)["id"] in ids
    close_cluster_client(client)


def test_a_batch_end_and_its_event_are_one_multi_on_a_cluster(cluster: list[RedisProc],
                                                            key_prefix: str) -> None:
    client = connect(cluster[0].url, cluster=True)
    keys = Keys(key_prefix)
    db, outbox = BulkDb(client, keys), Outbox(client, keys)
    db.add_bulk({"id": "batch_c1", "owner": "", "status": "in_progress",
                  "webhook": "https://hooks.example.com/b"}, 600)
    # CROSSSLOT if not one slot
    assert db.move("batch_c1", (BulkStatus.IN_PROGRESS,), BulkStatus.COMPLETED)
    taken = outbox.take(BULK_HOOK_TAG, 10, 60_000).events
    assert [e.webhook_id for e in taken] == ["batch_c1.batch.completed"]
    close_cluster_client(client)
