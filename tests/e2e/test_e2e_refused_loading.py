"""A model that no worker will serve is refused at once, not after a grace: a job
admitted while the only worker is still loading its models fails as soon as the worker
refuses the model (with the grace set far beyond the test's patience), a job after
that answers 503 with the reason, and a bulk batch's lines for such a model end with
the reason. Real gunicorn, a real Celery worker held "loading" by a gate, the feeder.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import openai
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.registry import Registry
from tests.conftest import make_env
from tests.support.bulk import (
    CATALOGUE_TOML,
    embedding_lines,
    lines_of,
    start_feeder,
    wait_batch,
)
from tests.support.gated_model import REFUSAL
from tests.support.images import image_file
from tests.support.procs import REPO_ROOT, start_web, start_worker, wait_until

#: Far beyond any wait below: a job that waited out the grace would time the test out.
GRACE_S = "300"
#: How long a refused model's job may take to fail: the worker's next beat, and more.
PROMPTLY_S = 60

#: The built-in synthetic model, loaded first, made a gate: the worker holds resnet18
#: (no weights: refused) in its "loading" set until the test opens the gate.
GATED_TOML = """
[models.synthetic]
kind = "python"
handler = "tests.support.gated_model:GatedLoad"
measure = "bytes"
input_schema = {{type = "object"}}
[models.synthetic.options]
started = "{started}"
gate = "{gate}"
"""


def submit_jpeg(base: str) -> requests.Response:
    return requests.post(f"{base}/submit?model=resnet18", data=image_file(64, 48), timeout=10,
                         headers={"Content-Type": "image/jpeg"})


def test_a_job_admitted_while_the_worker_loads_fails_once_it_refuses_the_model_not_after_the_grace(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    started, gate = tmp_path / "started", tmp_path / "gate"
    config = tmp_path / "catalogue.toml"
    config.write_text(GATED_TOML.format(started=started, gate=gate))
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config),
                   CARPOOL_REFUSED_GRACE_S=GRACE_S)
    worker_env = {**env, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    with start_web(env) as base, start_worker(worker_env, "w1@loads", ready=started.exists):
        r = submit_jpeg(base)
        assert r.status_code == 202, r.text  # the worker may yet serve it
        job_id = r.json()["id"]
        assert requests.get(f"{base}/result/{job_id}", timeout=10).json()["status"] == "queued"
        gate.touch()
        view = requests.get(f"{base}/result/{job_id}?wait={PROMPTLY_S}",
                            timeout=PROMPTLY_S + 30).json()
        assert view["status"] == "failed", view
        assert view["error_code"] == "model_unavailable"
        assert "worker w1@loads refused it" in view["error"], view
        assert "has no weights" in view["error"]
        # Each web process refreshes its own view of the refusals: assert on the 503
        # itself, not on a next request that another process may answer first.
        answers: list[requests.Response] = []
        wait_until(lambda: answers.append(submit_jpeg(base)) or answers[-1].status_code == 503,
                   10, "the web's cache to see the refusal")
        error = answers[-1].json()["error"]
        assert error["code"] == "model_unavailable"
        assert "worker w1@loads refused it" in error["message"]
        assert "has no weights" in error["message"]
        # The gate's own reason, once the answering process has reread the registry
        # (each does at most every REFRESH_S).
        wait_until(lambda: REFUSAL in requests.get(f"{base}/models", timeout=10).text, 10,
                   "/models to list the refusal")


def test_the_lines_of_a_batch_for_a_model_every_live_worker_refused_end_with_the_reason(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                   CARPOOL_FILES_DIR=str(tmp_path / "files"), CARPOOL_REFUSED_GRACE_S=GRACE_S)
    client = connect(redis_url)
    try:  # a worker that refused hemb, alive for the whole test; no worker serves it
        Registry(client, Keys(key_prefix)).publish("w1@refuses", [], {"hemb": "no hemb here"},
                                                  ttl_ms=600_000)
    finally:
        client.close()
    with start_web(env) as base, start_feeder(env, tmp_path / "feeder.log"), \
            openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as sdk:
        file_id = sdk.files.create(file=("in.jsonl", io.BytesIO(embedding_lines(20))),
                                   purpose="batch").id
        batch = sdk.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                   completion_window="24h")
        done = wait_batch(sdk, batch.id, {"completed", "failed"}, timeout_s=PROMPTLY_S)
        assert done.status == "completed", done
        assert lines_of(sdk, done.output_file_id) == []
        errors = lines_of(sdk, done.error_file_id)
    assert len(errors) == 20
    for line in errors:
        assert line["error"]["code"] == "model_unavailable", line
        assert "worker w1@refuses refused it: no hemb here" in line["error"]["message"]
