"""End to end through Flower's API: a real worker (claiming a GPU from an injected list)
and real Flower; a batch shows as a task, the worker's page shows GPU, models, limits."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.jobs import new_job_id
from carpool.core.settings import Settings
from tests.conftest import make_env
from tests.support.commands import argv
from tests.support.procs import answers, free_port, running, start_worker, wait_until

#: Tornado, Celery and Flower's first broker connection: a few seconds here.
FLOWER_START_TIMEOUT_S = 60.0
#: Bound on Flower seeing the events and the inspect replies of a worker already up.
FLOWER_SEES_S = 60.0


def flower_command(port: int) -> list[str]:
    """The shipped Flower command line, on a free port, on loopback only."""
    program, *args = argv("flower")
    args = [a for a in args if not a.startswith("--port")]
    return [str(Path(sys.executable).parent / program), *args, f"--port={port}",
            "--address=127.0.0.1"]


@pytest.fixture
def flower(redis_url: str, key_prefix: str) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**make_env(redis_url, key_prefix), "FLOWER_UNAUTHENTICATED_API": "1"}
    with running(flower_command(port), env, lambda: answers(f"{base}/healthcheck"), "flower",
                 FLOWER_START_TIMEOUT_S):
        yield base


def get(url: str, **params: Any) -> Any:
    r = requests.get(url, params=params, timeout=30)
    r.raise_for_status()
    return r.json()


def test_a_batch_shows_as_a_task_and_the_worker_shows_its_gpu_models_and_limits(
        flower: str, redis_url: str, key_prefix: str, queue: Queue, settings: Settings) -> None:
    node = f"flower-{key_prefix}@carpool-test"
    gpu = f"GPU-{key_prefix}"
    env = make_env(redis_url, key_prefix, CARPOOL_MODELS="synthetic", CARPOOL_GPU_CLAIM="1",
                   CARPOOL_GPU_DEVICES=gpu)
    spec = settings.catalogue.get("synthetic")
    sent: list[str] = []

    def batch_tasks() -> list[dict[str, Any]]:
        tasks = get(f"{flower}/api/tasks", taskname="carpool.batch", workername=node)
        return [t for t in tasks.values() if t.get("state") == "SUCCESS"]

    def a_batch_shows() -> bool:
        # Flower sees only the events sent after it subscribed: send a job at a time
        # until one of their batches shows.
        if batch_tasks():
            return True
        last = queue.get(sent[-1]) if sent else None
        if last is None or last.status.is_final:
            sent.append(single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
                spec, (AdmitJob(spec.bins[0], new_job_id(spec.name), '{"value": 1, "size": 1}'),),
                queued_ttl_s=60))).id)
        return False

    with start_worker(env, node_name=node):
        wait_until(a_batch_shows, FLOWER_SEES_S, "a carpool.batch task in Flower")
        task = batch_tasks()[0]
        assert task["name"] == "carpool.batch"
        kwargs = ast.literal_eval(task["kwargs"])
        assert (kwargs["model"], kwargs["bin"], kwargs["size"]) == ("synthetic", "small", 1)
        assert task["runtime"] is not None and task["runtime"] >= 0

        def stats() -> dict[str, Any] | None:
            workers = get(f"{flower}/api/workers", refresh=1)
            return workers.get(node, {}).get("stats") or None

        wait_until(lambda: stats() is not None, FLOWER_SEES_S, "the worker's stats in Flower")
        info = stats()
    assert info is not None
    # Rows of Flower's "Other" tab: one plain sentence each, no nested dict.
    assert gpu in info["carpool gpu"]
    assert info["carpool models"] == "synthetic"
    assert info["carpool synthetic/small"] == "max_batch 32, max_wait_ms 20, adaptive, running"
    assert not any(isinstance(v, dict) for k, v in info.items() if k.startswith("carpool"))
    assert queue.client.get(queue.keys.gpu(gpu)) is None  # released on the warm shutdown
