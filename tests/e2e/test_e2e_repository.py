"""Triton's repository API end to end, driven by the unmodified ``tritonclient.http``
client and ``carpool models``: real gunicorn, real Celery workers serving synthetic
models. A load waits for a worker to load and warm the model; an unload refuses new
jobs at once, ends the queued ones with the reason, lets the claimed ones finish; two
loads at once load once; a worker killed while loading loses no job; a model's version
unloads alone while the model serves on."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import log_says, start_web, start_worker, wait_until

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

#: A bound on any wait for a worker to act (poll, load, finish a batch).
ACT_S = 60.0
#: Each test's own model; ``pinned`` batches two at a time.
CATALOGUE = "".join(f"""
[models.{name}]
kind = "synthetic"
measure = "size"
[[models.{name}.bins]]
name = "only"
max_size = 64
max_batch = {batch}
max_wait_ms = 0
max_depth = 100
""" for name, batch in (("reload", 8), ("pinned", 2), ("dying", 8), ("twice", 8),
                        ("cli", 8), ("ver", 8), ("cut", 2))) + """
[models.ver.versions.2]
result_ttl_s = 120
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The web, shared; each test starts its own workers with ``env``."""
    tmp = tmp_path_factory.mktemp("repository")
    (tmp / "catalogue.toml").write_text(CATALOGUE)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_MAX_WAIT_S="30", CARPOOL_SYNTHETIC_COST_MS="2,0.1")
    try:
        with start_web(env) as base:
            yield {**env, "base": base}
    finally:
        client = connect(REDIS_URL)
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
        client.close()


def worker_env(stack: dict[str, str], model: str, **extra: str) -> dict[str, str]:
    return {**{k: v for k, v in stack.items() if k != "base"}, "CARPOOL_MODELS": model,
            **extra}


def triton(stack: dict[str, str]) -> Any:
    return httpclient.InferenceServerClient(url=stack["base"].removeprefix("http://"),
                                            network_timeout=120.0)


def state_of(client: Any, model: str, version: str = "1") -> tuple[str, str]:
    entry = next(e for e in client.get_model_repository_index()
                 if (e["name"], e["version"]) == (model, version))
    return entry["state"], entry.get("reason", "")


def submit(base: str, model: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        r = requests.post(f"{base}/submit", json={"model": model, "input": {"value": i,
                                                                            "size": 4}},
                          timeout=10)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return ids


def final(base: str, job_id: str) -> dict[str, Any]:
    view: dict[str, Any] = requests.get(f"{base}/result/{job_id}?wait=30", timeout=60).json()
    assert view["status"] in ("done", "failed", "expired"), view
    return view


def infer(client: Any, model: str, version: str = "") -> Any:
    tensor = httpclient.InferInput("VALUE", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return client.infer(model, [tensor], model_version=version)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` on a thread; the list gets its result or the exception it raised.
    tritonclient.http runs on gevent, whose hub is per thread: ``call`` makes its own
    client."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 — handed to the test to assert on
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_tritonclient_unloads_and_loads_a_model_with_a_config_override(
        stack: dict[str, str]) -> None:
    client = triton(stack)
    with start_worker(worker_env(stack, "reload"), "w-reload@repo"):
        wait_until(lambda: client.is_model_ready("reload", "1"), ACT_S, "reload to be ready")
        assert state_of(client, "reload") == ("READY", "")
        client.unload_model("reload")
        assert not client.is_model_ready("reload", "1")  # at once, from any web process
        with pytest.raises(InferenceServerException, match="was unloaded"):
            infer(client, "reload")
        r = requests.post(f"{stack['base']}/submit",
                          json={"model": "reload", "input": {"value": 1, "size": 4}}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
        assert "was unloaded" in r.json()["error"]["message"]
        wait_until(lambda: state_of(client, "reload") == ("UNAVAILABLE", "unloaded"), ACT_S,
                   "the worker to free reload")
        client.load_model("reload", config=json.dumps({"options": {"load_delay_ms": 300}}))
        assert client.is_model_ready("reload", "1")  # the load answered once served
        assert state_of(client, "reload") == ("READY", "")
        assert infer(client, "reload").as_numpy("ECHO").tolist() == [[1, 1, 1, 1]]


def test_an_unload_lets_claimed_jobs_finish_and_ends_queued_ones_with_the_reason(
        stack: dict[str, str], tmp_path: Path) -> None:
    client, base = triton(stack), stack["base"]
    log = tmp_path / "worker.log"
    # Each batch of two takes 1.5 s: the first batches are claimed, the rest wait.
    with start_worker(worker_env(stack, "pinned", CARPOOL_SYNTHETIC_COST_MS="1500,0"),
                      "w-pinned@repo", log_path=log):
        wait_until(lambda: client.is_model_ready("pinned"), ACT_S, "pinned to be ready")
        ids = submit(base, "pinned", 10)
        running: list[str] = []
        wait_until(lambda: bool(running.extend(
            j for j in ids if requests.get(f"{base}/result/{j}", timeout=10).json()["status"]
            == "running") or running), ACT_S, "a batch to be claimed")
        client.unload_model("pinned")
        views = {j: final(base, j) for j in ids}
        done = [j for j, v in views.items() if v["status"] == "done"]
        failed = [v for v in views.values() if v["status"] == "failed"]
        assert set(running) <= set(done)  # claimed: finished
        assert failed and len(done) + len(failed) == len(ids)  # queued: ended, none lost
        for view in failed:
            assert view["error_code"] == "model_unavailable", view
            assert "was unloaded" in view["error"] and "no worker had taken" in view["error"]
        wait_until(lambda: state_of(client, "pinned") == ("UNAVAILABLE", "unloaded"), ACT_S,
                   "the worker to free pinned")
        assert log_says(log, "unloaded model 'pinned'")
        client.load_model("pinned")
        assert final(base, submit(base, "pinned", 1)[0])["status"] == "done"


def test_a_worker_killed_while_loading_loses_no_job(stack: dict[str, str]) -> None:
    client, base = triton(stack), stack["base"]
    with start_worker(worker_env(stack, "dying"), "w-dying-1@repo") as first:
        wait_until(lambda: client.is_model_ready("dying"), ACT_S, "dying to be ready")
        slow = json.dumps({"options": {"load_delay_ms": 600_000}})
        first_load, first_answer = in_thread(lambda: triton(stack).load_model("dying",
                                                                              config=slow))
        wait_until(lambda: state_of(client, "dying")[0] == "LOADING", ACT_S,
                   "the worker to be loading")
        ids = submit(base, "dying", 5)  # a model loading queues its jobs
        first.kill()  # SIGKILL mid-load
        first.wait()
    # A fast load now, and a worker to take it: the killed worker's load is replaced.
    fast = json.dumps({"options": {"load_delay_ms": 0}})
    second_load, second_answer = in_thread(lambda: triton(stack).load_model("dying",
                                                                             config=fast))
    with start_worker(worker_env(stack, "dying"), "w-dying-2@repo"):
        for thread in (first_load, second_load):
            thread.join(ACT_S)
        assert first_answer == [None] and second_answer == [None]  # both answered 200
        assert [final(base, j)["status"] for j in ids] == ["done"] * 5
        assert state_of(client, "dying") == ("READY", "")


def test_two_loads_at_once_load_once(stack: dict[str, str], tmp_path: Path) -> None:
    client = triton(stack)
    log = tmp_path / "worker.log"
    with start_worker(worker_env(stack, "twice"), "w-twice@repo", log_path=log):
        wait_until(lambda: client.is_model_ready("twice"), ACT_S, "twice to be ready")
        # Long enough that the second load, started in a new thread with a new client,
        # reaches the web while the first is still under way, however busy the machine.
        config = json.dumps({"options": {"load_delay_ms": 5000}})
        one, one_answer = in_thread(lambda: triton(stack).load_model("twice", config=config))
        wait_until(lambda: state_of(client, "twice")[0] == "LOADING", ACT_S,
                   "the first load to be under way")
        two, two_answer = in_thread(lambda: triton(stack).load_model("twice", config=config))
        for thread in (one, two):
            thread.join(ACT_S)
        assert one_answer == [None] and two_answer == [None]
        loads = [line for line in log.read_text().splitlines()
                 if "loading model 'twice'" in line]
        assert len(loads) == 1, loads


def carpool(stack: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "carpool.cli", "models", *args,
                           "--url", stack["base"]], capture_output=True, text=True,
                          timeout=ACT_S, check=False)


def test_carpool_models_unloads_before_any_worker_and_a_worker_starts_serving_nothing(
        stack: dict[str, str]) -> None:
    unloaded = carpool(stack, "unload", "cli")  # a state in Redis, for workers to come
    assert unloaded.returncode == 0 and json.loads(unloaded.stdout)["state"] == "UNAVAILABLE"
    with start_worker(worker_env(stack, "cli"), "w-cli@repo"):
        listed = carpool(stack, "list")
        assert "cli                  1    UNAVAILABLE  unloaded" in listed.stdout, listed.stdout
        bad = carpool(stack, "load", "cli", "--config", '{"max_batch": 3}')
        assert bad.returncode == 1 and "400" in bad.stderr and "unknown keys" in bad.stderr
        loaded = carpool(stack, "load", "cli", "--config", '{"options": {"load_delay_ms": 10}}')
        assert loaded.returncode == 0, loaded.stderr
        assert json.loads(loaded.stdout)["state"] == "READY"
        assert "cli                  1    READY" in carpool(stack, "list").stdout
        assert final(stack["base"], submit(stack["base"], "cli", 1)[0])["status"] == "done"


def test_a_version_unloads_alone_while_the_model_serves_on_and_loads_with_it(
        stack: dict[str, str], tmp_path: Path) -> None:
    client = triton(stack)
    log = tmp_path / "worker.log"
    with start_worker(worker_env(stack, "ver,ver@2"), "w-ver@repo", log_path=log):
        wait_until(lambda: client.is_model_ready("ver", "1") and client.is_model_ready(
            "ver", "2"), ACT_S, "both versions of ver to be ready")
        assert [(e["version"], e["state"]) for e in client.get_model_repository_index()
                if e["name"] == "ver"] == [("1", "READY"), ("2", "READY")]
        client.unload_model("ver@2")  # sent as ver%402
        assert not client.is_model_ready("ver", "2")
        assert client.is_model_ready("ver", "1") and client.is_model_ready("ver")
        with pytest.raises(InferenceServerException, match="'ver@2' was unloaded"):
            infer(client, "ver", "2")
        wait_until(lambda: state_of(client, "ver", "2") == ("UNAVAILABLE", "unloaded"),
                   ACT_S, "the worker to free ver@2")
        assert log_says(log, "unloaded model 'ver@2'")
        assert state_of(client, "ver") == ("READY", "")
        assert infer(client, "ver").as_numpy("ECHO").tolist() == [[1, 1, 1, 1]]
        client.load_model("ver")  # every version of ver
        assert client.is_model_ready("ver", "2")
        assert infer(client, "ver", "2").as_numpy("ECHO").tolist() == [[1, 1, 1, 1]]
        client.unload_model("ver")
        assert not (client.is_model_ready("ver", "1") or client.is_model_ready("ver", "2"))


def test_a_worker_killed_mid_batch_after_an_unload_ends_its_jobs_failed_not_queued(
        stack: dict[str, str]) -> None:
    """The claimed jobs of an unloaded model whose worker dies go back to their bin;
    the next worker that may serve it ends them with the unload's reason."""
    client, base = triton(stack), stack["base"]
    env = worker_env(stack, "cut", CARPOOL_SYNTHETIC_COST_MS="600000,0",
                     CARPOOL_LEASE_MS="1500")
    with start_worker(env, "w-cut@repo") as first:
        wait_until(lambda: client.is_model_ready("cut"), ACT_S, "cut to be ready")
        ids = submit(base, "cut", 2)
        wait_until(lambda: all(requests.get(f"{base}/result/{j}", timeout=10).json()[
            "status"] == "running" for j in ids), ACT_S, "the batch to be claimed")
        client.unload_model("cut")
        first.kill()
        first.wait()
    with start_worker(worker_env(stack, "cut"), "w-cut@repo"):  # the same name: reclaims
        for view in (final(base, j) for j in ids):
            assert view["status"] == "failed" and "was unloaded" in view["error"], view
