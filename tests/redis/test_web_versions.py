"""A model's versions on a real Redis: "m@2" jobs land in m@2's own bins and say
model_version "2" from admission on; a claim taken back (a lease lost, a hand-back)
returns them to those bins; a batch loop serving both versions at once never puts
two versions in one batch, as each job's batch stamp shows; /v2's /versions/<v>
paths admit to that version."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.keys import Keys
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.settings import Settings, load_settings
from carpool.core.shards import shard
from carpool.core.versions import version_map
from dispatcher.dispatcher import Dispatcher
from tests.conftest import make_env
from tests.support.hookstack import DEPLOY_SECRET
from tests.support.procs import wait_until
from tests.support.webtools import app_state, web_client
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.loop import BatchLoop

#: synthetic's version 2, with one bin of its own ("all") and version 1's own.
VERSIONS_TOML = """
[models.synthetic.versions.2]
result_ttl_s = 120
[[models.synthetic.versions.2.bins]]
name = "all"
max_size = 1024
max_batch = 4
max_wait_ms = 5
max_depth = 100
"""
#: Jobs of each version the loop test admits: several batches' worth of each.
JOBS_PER_VERSION = 12


@pytest.fixture
def settings(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    config = tmp_path / "catalogue.toml"
    config.write_text(VERSIONS_TOML)
    return load_settings(make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config)))


@pytest.fixture
def http(settings: Settings, client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(settings) as c:
        yield c


def submit(http: FlaskClient, model: str, value: Any = 0, size: int = 5) -> dict[str, Any]:
    resp = http.post("/submit", json={"model": model, "input": {"value": value, "size": size}})
    assert resp.status_code == 202, resp.get_json()
    body: dict[str, Any] = resp.get_json()
    return body


def doc(http: FlaskClient, job_id: str) -> dict[str, Any]:
    resp = http.get(f"/result/{job_id}")
    assert resp.status_code == 200
    body: dict[str, Any] = resp.get_json()
    return body


def test_an_m_at_2_job_lands_in_m_at_2s_bins_and_says_version_2_from_admission_on(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    two = submit(http, "synthetic@2")
    assert (two["model"], two["model_version"], two["bin"]) == ("synthetic", "2", "all")
    one = submit(http, "synthetic@1")  # the model's own entry, as "synthetic" names it
    assert (one["model"], one["model_version"], one["bin"]) == ("synthetic", "1", "small")
    many = http.post("/submit/batch", json={"model": "synthetic@2", "inputs": [
        {"value": 1, "size": 3}, {"value": 2, "size": 900}]}).get_json()["jobs"]
    assert [(j["model_version"], j["bin"]) for j in many] == [("2", "all"), ("2", "all")]
    assert set(client.zrange(keys.bin("synthetic@2", "all"), 0, -1)) == {
        two["id"], *(j["id"] for j in many)}
    assert client.zrange(keys.bin("synthetic", "small"), 0, -1) == [one["id"]]
    queued = doc(http, two["id"])
    assert (queued["status"], queued["model"], queued["model_version"]) == (
        "queued", "synthetic", "2")
    assert doc(http, one["id"])["model_version"] == "1"
    versions = {m["name"]: (m["model"], m["version"]) for m in http.get("/models").get_json()[
        "models"] if m["model"] == "synthetic"}
    assert versions == {"synthetic": ("synthetic", "1"), "synthetic@2": ("synthetic", "2")}


def test_an_unknown_version_is_a_404_naming_the_versions_there_are(http: FlaskClient) -> None:
    resp = http.post("/submit", json={"model": "synthetic@3", "input": {"value": 0, "size": 1}})
    assert resp.status_code == 404
    assert resp.get_json()["error"]["message"] == (
        "model 'synthetic' has no version '3'; its versions: 1, 2")
    v2 = http.get("/v2/models/synthetic/versions/3")
    assert v2.status_code == 404 and "its versions: 1, 2" in v2.get_json()["error"]
    embed = http.post("/v1/embeddings", json={"model": "minilm@4", "input": "hi"})
    assert embed.status_code == 404 and "its versions: 1" in embed.get_json()["error"]["message"]


def test_a_lost_lease_and_a_hand_back_return_an_m_at_2_job_to_m_at_2s_bin(
        http: FlaskClient, queue: Queue, keys: Keys, settings: Settings) -> None:
    two = settings.catalogue.get("synthetic@2")
    job_id = submit(http, "synthetic@2")["id"]
    leases = Leases(queue.client, keys, settings.catalogue)
    claimed = queue.claim(two, "all", 4, lease_ms=0, token="w:1", worker="w")  # expired at once
    assert [j.id for j in claimed.jobs] == [job_id]
    assert leases.reap(max_attempts=3).requeued == 1
    assert queue.client.zrange(keys.bin("synthetic@2", "all"), 0, -1) == [job_id]
    again = queue.claim(two, "all", 4, lease_ms=60_000, token="w:2", worker="w")
    assert leases.release("w:2", [j.id for j in again.jobs], refund_attempt=True) == [True]
    assert queue.client.zrange(keys.bin("synthetic@2", "all"), 0, -1) == [job_id]
    assert doc(http, job_id)["model_version"] == "2"


def serving(settings: Settings, queue: Queue, *models: str) -> BatchLoop:
    handlers = {m: SyntheticHandler(settings.catalogue.get(m), (1.0, 0.1)) for m in models}
    return BatchLoop(settings, queue, dict(handlers), "w-versions")


def test_one_loop_serving_both_versions_never_batches_them_together(
        http: FlaskClient, settings: Settings) -> None:
    addressed = {submit(http, model, value=i, size=1 + i)["id"]: version
                 for i in range(JOBS_PER_VERSION)
                 for model, version in (("synthetic", "1"), ("synthetic@2", "2"))}
    loop = serving(settings, app_state(http).queue, "synthetic", "synthetic@2")
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: all(doc(http, j)["status"] == "done" for j in addressed), 30,
                   "every job of both versions to end")
    finally:
        loop.stop()
        thread.join(10)
    batches: dict[str, set[str]] = {}
    for job_id, version in addressed.items():
        ended = doc(http, job_id)
        assert ended["model_version"] == ended["batch"]["model_version"] == version
        batches.setdefault(ended["batch"]["id"], set()).add(ended["model_version"])
    assert len(batches) >= 2 and all(len(v) == 1 for v in batches.values()), batches


def test_v2s_versions_path_admits_to_that_version_and_its_answer_names_it(
        http: FlaskClient, settings: Settings) -> None:
    loop = serving(settings, app_state(http).queue, "synthetic@2")
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        resp = http.post("/v2/models/synthetic/versions/2/infer", json={
            "model_name": "synthetic", "model_version": "2",
            "inputs": [{"name": "VALUE", "datatype": "FP32", "shape": [1, 3],
                        "data": [[1.0, 2.0, 3.0]]}]})
    finally:
        loop.stop()
        thread.join(10)
    assert resp.status_code == 200, resp.get_json()
    answer = resp.get_json()
    assert (answer["model_name"], answer["model_version"]) == ("synthetic", "2")
    (job_id,) = answer["parameters"]["carpool_job_ids"]
    assert doc(http, job_id)["model_version"] == "2"
    meta = http.get("/v2/models/synthetic").get_json()
    assert (meta["name"], meta["versions"]) == ("synthetic", ["1", "2"])
    assert http.get("/v2/models/synthetic/versions/2").get_json()["versions"] == ["2"]
    stats = http.get("/v2/models/synthetic/versions/2/stats").get_json()["model_stats"][0]
    assert (stats["version"], stats["inference_count"]) == ("2", 1)


def test_a_model_entrys_own_version_shows_in_its_jobs_documents_and_webhooks(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis) -> None:
    config = tmp_path / "own.toml"
    config.write_text('[models.synthetic]\nversion = "2024-06"\n')
    settings = load_settings(make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config),
                                      CARPOOL_WEBHOOK_SECRET=DEPLOY_SECRET,
                                      CARPOOL_WEBHOOK_ALLOW_PRIVATE="1"))
    assert version_map(settings.catalogue)["synthetic"] == "2024-06"
    with web_client(settings) as http:
        resp = http.post("/submit", json={"model": "synthetic@2024-06", "webhook":
                                          "http://127.0.0.1:9/h", "input": {"value": 0, "size": 1}})
        job = resp.get_json()
        assert (job["bin"], job["model_version"]) == ("small", "2024-06")
        assert doc(http, job["id"])["model_version"] == "2024-06"
        assert http.delete(f"/result/{job['id']}").status_code == 200
    dispatcher = Dispatcher(settings, client)
    (event,) = dispatcher.outbox.take(shard("synthetic"), 10, 5000).events
    (body,) = dispatcher._bodies([event])
    assert json.loads(body)["event"] == "cancelled"
    assert json.loads(body)["model_version"] == "2024-06"  # the catalogue's, not a default


def test_the_openapi_document_offers_each_version_under_valid_component_names(
        http: FlaskClient) -> None:
    doc = http.get("/openapi.json").get_json()
    schemas = doc["components"]["schemas"]
    assert schemas["Submit_synthetic.v2"]["properties"]["model"]["enum"] == ["synthetic@2"]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in schemas)  # OpenAPI's rule
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(doc)))
    assert refs <= set(schemas) and "Submit_synthetic.v2" in refs
