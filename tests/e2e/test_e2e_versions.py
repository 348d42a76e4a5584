"""Two versions of one model served at once, end to end: real gunicorn and two Celery
workers, one serving ``hemb`` (version 1, 8-wide vectors) and one ``hemb@2`` (its
version 2, whose options make 16-wide ones). Jobs of both, submitted interleaved, each
end on their own version's worker with their own version's options; every document
names the version addressed, and no batch id spans two versions."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import make_env
from tests.support.bulk import CATALOGUE_TOML
from tests.support.procs import start_web, start_worker, wait_until
from tests.support.redisproc import private_redis

#: hemb's version 2: the same model but for its options (a 16-wide vector).
VERSION_2 = """
[models.hemb.versions.2.options]
dim = 16
"""
#: Each version's vector width, and the worker that serves it.
WIDTH = {"1": 8, "2": 16}
NODE = {"1": "v1@versions", "2": "v2@versions"}
#: Requests of each version, sent at once, of INPUTS texts each.
REQUESTS, INPUTS = 6, 8
WAIT_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config: Path = tmp_path_factory.mktemp("versions") / "catalogue.toml"
    config.write_text(CATALOGUE_TOML + VERSION_2)
    with private_redis() as server:
        # 20 ms a batch: jobs queue behind a running batch, so batches hold several.
        env = make_env(server.url, "versions", CARPOOL_CONFIG=str(config),
                       CARPOOL_SYNTHETIC_COST_MS="20,0")
        with (start_web(env) as base,
              start_worker({**env, "CARPOOL_MODELS": "hemb",
                            "CARPOOL_WORKER_NAME": NODE["1"]}, NODE["1"]),
              start_worker({**env, "CARPOOL_MODELS": "hemb@2",
                            "CARPOOL_WORKER_NAME": NODE["2"]}, NODE["2"])):
            yield base


def submit_many(base: str, model: str, n: int) -> list[str]:
    texts = [f"{model} text {i}" for i in range(n)]
    resp = requests.post(f"{base}/submit/batch", timeout=10, json={
        "model": model, "inputs": [{"text": t} for t in texts]})
    assert resp.status_code == 202, resp.text
    return [job["id"] for job in resp.json()["jobs"]]


def document(base: str, job_id: str) -> dict[str, Any]:
    resp = requests.get(f"{base}/result/{job_id}", timeout=10)
    assert resp.status_code == 200
    doc: dict[str, Any] = resp.json()
    return doc


def test_both_versions_are_served_at_once_each_job_by_its_own(stack: str) -> None:
    models = {m["name"]: m for m in requests.get(f"{stack}/models", timeout=10).json()["models"]}
    assert models["hemb@2"]["version"] == "2" and models["hemb"]["version"] == "1"
    addressed = [("hemb", "1"), ("hemb@2", "2")] * REQUESTS
    with ThreadPoolExecutor(len(addressed)) as pool:  # both versions' jobs at once
        sent = list(pool.map(lambda a: (a[1], submit_many(stack, a[0], INPUTS)), addressed))
    version_of = {job_id: version for version, ids in sent for job_id in ids}
    docs: dict[str, dict[str, Any]] = {}

    def all_done() -> bool:
        for job_id in version_of.keys() - docs.keys():
            doc = document(stack, job_id)
            if doc["status"] in ("done", "failed", "expired", "cancelled"):
                docs[job_id] = doc
        return len(docs) == len(version_of)

    wait_until(all_done, WAIT_S, "every job of both versions to end")
    batches: dict[str, set[str]] = {}
    for job_id, version in version_of.items():
        doc = docs[job_id]
        assert doc["status"] == "done", doc
        assert (doc["model"], doc["model_version"]) == ("hemb", version)
        assert len(doc["result"]["embedding"]) == WIDTH[version]  # its version's options
        assert doc["batch"]["worker"] == NODE[version]
        assert doc["batch"]["model_version"] == version
        batches.setdefault(doc["batch"]["id"], set()).add(doc["model_version"])
    assert all(len(versions) == 1 for versions in batches.values()), batches
    assert max(len([j for j in docs.values() if j["batch"]["id"] == b]) for b in batches) > 1


def test_the_openai_surface_addresses_a_version_as_m_at_v(stack: str) -> None:
    for model, version in (("hemb@2", "2"), ("hemb", "1")):
        resp = requests.post(f"{stack}/v1/embeddings", timeout=30,
                             json={"model": model, "input": ["a", "b"]})
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert (answer["model"], answer["model_version"]) == (model, version)
        assert [len(d["embedding"]) for d in answer["data"]] == [WIDTH[version]] * 2
    unknown = requests.post(f"{stack}/v1/embeddings", timeout=10,
                            json={"model": "hemb@3", "input": "a"})
    assert unknown.status_code == 404
    assert "its versions: 1, 2" in unknown.json()["error"]["message"]
