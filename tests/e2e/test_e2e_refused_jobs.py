"""A job queued before any worker registered, for a model the worker then refuses,
ends "failed" (model_unavailable) once it refuses it, instead of waiting out its TTL;
a job of a model that no live worker knows at all stays queued. Real gunicorn and
a real worker (the built-in catalogue: resnet18 has no weights, so it is refused).
"""

from __future__ import annotations

from pathlib import Path

import requests

from tests.conftest import make_env
from tests.support.images import image_file
from tests.support.procs import start_web, start_worker

#: A model only the web's catalogue has: no worker tries it, so it has no live worker.
ONLY_THE_WEB_KNOWS = """
[models.tiny]
kind = "synthetic"
measure = "size"
[[models.tiny.bins]]
name = "only"
max_size = 10
max_batch = 1
max_wait_ms = 20
max_depth = 10
"""


def test_a_job_queued_before_the_worker_refused_its_model_fails_once_it_refuses_it(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    config = tmp_path / "web.toml"
    config.write_text(ONLY_THE_WEB_KNOWS)
    web_env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config))
    worker_env = make_env(redis_url, key_prefix, CARPOOL_REFUSED_GRACE_S="1")
    with start_web(web_env) as base:
        r = requests.post(f"{base}/submit?model=resnet18", data=image_file(64, 48), timeout=10,
                          headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 202, r.text  # no live worker yet: queued
        refused_id = r.json()["id"]
        r = requests.post(f"{base}/submit", timeout=10, json={
            "model": "tiny", "input": {"value": 1, "size": 1}})
        assert r.status_code == 202, r.text
        lonely_id = r.json()["id"]
        with start_worker(worker_env, "w1@refuses"):
            view = requests.get(f"{base}/result/{refused_id}?wait=60", timeout=90).json()
            lonely = requests.get(f"{base}/result/{lonely_id}", timeout=10).json()
    assert view["status"] == "failed", view
    assert view["error_code"] == "model_unavailable"
    assert "worker w1@refuses refused it" in view["error"] and "has no weights" in view["error"]
    assert lonely["status"] == "queued", lonely
    assert lonely["waiting_for"]["state"] == "no worker"
