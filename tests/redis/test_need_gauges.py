"""The scaling gauges on the web's GET /metrics, computed at scrape time from a real
Redis: bins, the workers' registry entries (costs, cold starts, loading) and leases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.keys import Keys
from carpool.backend.leases import claim_token
from carpool.backend.queue import Queue
from carpool.backend.registry import Registry
from carpool.scheduling.batching import Cost
from tests.support.promtext import Scrape
from tests.support.webtools import app_state, web_client, web_settings

MODELS = ("synthetic", "tiny", "imgs", "texts")


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


@pytest.fixture
def registry(client: redis.Redis, keys: Keys) -> Registry:
    return Registry(client, keys)


def scrape(http: FlaskClient) -> Scrape:
    resp = http.get("/metrics")
    assert resp.status_code == 200
    return Scrape(resp.get_data(as_text=True))


def needed(s: Scrape, model: str) -> tuple[float, float]:
    return (s.value("carpool_workers_needed", model=model),
            s.value("carpool_deadline_misses_projected", model=model))


def submit_tiny(http: FlaskClient, n: int) -> None:
    for i in range(n):  # tiny: one job a batch, due 4 s after admission
        resp = http.post("/submit", json={"model": "tiny", "input": {"value": i, "size": 1}})
        assert resp.status_code == 202, resp.get_json()


def test_nothing_queued_and_no_worker_needs_no_worker(http: FlaskClient) -> None:
    s = scrape(http)
    assert {m: needed(s, m) for m in MODELS} == {m: (0, 0) for m in MODELS}


def test_a_queued_job_with_no_worker_needs_one_and_is_projected_late(
        http: FlaskClient) -> None:
    submit_tiny(http, 1)
    # No worker ever measured tiny: the default cold start (60 s) is past its 4 s.
    assert needed(scrape(http), "tiny") == (1, 1)
    assert needed(scrape(http), "synthetic") == (0, 0)


def test_workers_loading_or_holding_a_lease_are_never_scaled_away(
        http: FlaskClient, registry: Registry, queue: Queue, keys: Keys) -> None:
    registry.publish("w-load", [], {}, loading=["synthetic"])
    registry.publish("w-busy", ["synthetic"], {})
    registry.publish("w-idle", ["synthetic"], {})
    assert needed(scrape(http), "synthetic") == (1, 0)  # the one loading
    resp = http.post("/submit", json={"model": "synthetic", "input": {"value": 1, "size": 1}})
    assert resp.status_code == 202
    spec = app_state(http).settings.catalogue.models["synthetic"]
    claim = queue.claim(spec, "small", 1, lease_ms=30_000, token=claim_token("w-busy", 1),
                        worker="w-busy")
    assert len(claim.jobs) == 1
    # Nothing queued, nothing measured arriving: the floor alone, busy + loading.
    assert needed(scrape(http), "synthetic")[0] == 2


def test_costs_and_cold_starts_from_the_registry_size_a_backlog(
        http: FlaskClient, registry: Registry) -> None:
    submit_tiny(http, 2)
    registry.publish("w1", ["tiny"], {}, cold_start_s={"tiny": 1.0},
                     costs={("tiny", "only"): Cost(3000.0, 0.0)})
    # W = 2 batches × 3 s = 6 s, due in 4 s: the worker up does 4 s of it, a worker
    # started now 4 − 1 = 3 s; so 2 workers. With it alone the second job ends at 6 s: late.
    assert needed(scrape(http), "tiny") == (2, 1)
    # The entry lapses: the cost and cold start last seen still hold, and with no
    # worker up both jobs wait for a cold start and are late.
    registry.withdraw("w1")
    assert needed(scrape(http), "tiny") == (2, 2)
