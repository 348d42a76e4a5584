"""A model that every live worker refused is refused at submit (503, with the reason);
following that reason's advice to the letter serves it. Real gunicorn and workers.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import requests
import torch
import torchvision

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.registry import Registry
from tests.conftest import make_env
from tests.support.images import image_file
from tests.support.procs import start_web, start_worker, wait_until

#: The snippet a refusal advises: "set [models.X.options] weights = "..." in CARPOOL_CONFIG".
ADVICE = re.compile(r'set (\[models\.resnet18\.options\]) (weights = "[^"]+") in CARPOOL_CONFIG')


def submit_jpeg(base: str, data: bytes) -> requests.Response:
    return requests.post(f"{base}/submit?model=resnet18", data=data, timeout=10,
                         headers={"Content-Type": "image/jpeg"})


def registry_state(env: dict[str, str], model: str) -> str | None:
    client = connect(env["CARPOOL_REDIS_URL"])
    try:
        live = Registry(client, Keys(env["CARPOOL_KEY_PREFIX"])).live()
    finally:
        client.close()
    if not live:
        return None
    return "served" if any(model in w.served for w in live) else (
        "refused" if any(model in w.refused for w in live) else "other")


def models_entry(base: str, name: str) -> dict[str, Any]:
    models = requests.get(f"{base}/models", timeout=10).json()["models"]
    entry: dict[str, Any] = next(m for m in models if m["name"] == name)
    return entry


def advised_config(message: str, weights: Path, tmp_path: Path) -> Path:
    """CARPOOL_CONFIG holding exactly the snippet ``message`` advises, with a real path."""
    found = ADVICE.search(message)
    assert found is not None, message
    table, line = found.groups()
    config = tmp_path / "carpool.toml"
    config.write_text(f"{table}\n{line.replace('/path/to/file', str(weights))}\n")
    return config


def test_a_jpeg_for_a_refused_model_answers_503_naming_the_weights_then_the_advice_serves_it(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    jpeg = image_file(320, 240)
    env = make_env(redis_url, key_prefix)  # the built-in catalogue; the worker tries every model
    with start_web(env) as base, start_worker(env, "w1@refuses"):
        wait_until(lambda: registry_state(env, "resnet18") == "refused", 30,
                   "the worker to publish its refusal")
        # The web rereads the registry every few seconds: the refusal shows within that.
        wait_until(lambda: submit_jpeg(base, jpeg).status_code == 503, 10, "a 503")
        r = submit_jpeg(base, jpeg)
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "model_unavailable" and "has no weights" in error["message"]
        batch = requests.post(f"{base}/submit/batch", timeout=10, json={
            "model": "resnet18", "inputs": [{"image_b64": base64.b64encode(jpeg).decode()}]})
        assert batch.status_code == 503 and batch.json()["error"]["code"] == "model_unavailable"
        workers = models_entry(base, "resnet18")["workers"]
        assert workers["state"] == "refused" and workers["served_by"] == 0
        assert "has no weights" in workers["refused"][0]["reason"]
        for served in ("synthetic", "efficientnet_lite0"):  # its weights come with it
            assert models_entry(base, served)["workers"] == {
                "state": "served", "served_by": 1, "loading_by": 0, "refused": []}
    message = error["message"]

    torch.manual_seed(0)
    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    env = make_env(redis_url, key_prefix,
                   CARPOOL_CONFIG=str(advised_config(message, weights, tmp_path)))
    with start_web(env) as base:
        r = submit_jpeg(base, jpeg)  # no live worker: queued (scale from zero)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        assert models_entry(base, "resnet18")["workers"]["state"] == "no worker"
        with start_worker(env, "w1@serves"):
            view = requests.get(f"{base}/result/{job_id}?wait=60", timeout=90).json()
    assert view["status"] == "done", view
    top_k = view["result"]["top_k"]
    labels = torchvision.models.ResNet18_Weights.DEFAULT.meta["categories"]
    assert len(top_k) == 5 and all(t["label"] == labels[t["index"]] for t in top_k)
