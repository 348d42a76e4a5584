"""`carpool up` says "ready", and sends the demo's job, only once each worker it
started has registered its models, and prints each model's state first: the wait
on a real Redis, and `carpool up --demo` with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from carpool.backend.keys import Keys
from carpool.backend.registry import Registry
from carpool.core.errors import CarpoolError
from carpool.stack.readiness import model_lines, report_until_ready, wait_registered
from carpool.stack.redis_local import free_port, start_redis
from tests.conftest import make_env

NO_WEIGHTS = "model 'resnet18' has no weights: set ..."


def test_the_wait_ends_when_every_worker_started_has_an_entry(
        client: redis.Redis, keys: Keys) -> None:
    registry = Registry(client, keys)
    registry.publish("worker0@host", ["synthetic"], {"resnet18": NO_WEIGHTS})
    registry.publish("other@host", ["synthetic"], {})  # not one of ours
    beats: list[float] = []

    def pause(_: float) -> None:  # the second worker registers during the first pause
        beats.append(1.0)
        registry.publish("worker1@host", [], {"resnet18": NO_WEIGHTS})

    live, missing = wait_registered(registry, ["worker0", "worker1"], 60.0, lambda: None, pause)
    assert missing == [] and len(beats) == 1
    assert {w.worker for w in live} >= {"worker0@host", "worker1@host"}
    assert model_lines(live, ["synthetic", "resnet18", "tiny"], []) == [
        "model   synthetic  served (other@host, worker0@host)",
        f"model   resnet18   refused by worker0@host: {NO_WEIGHTS}",
        "model   tiny       no worker serves it"]


def test_a_worker_still_loading_its_models_is_waited_for_until_its_entry_says_what_it_serves(
        client: redis.Redis, keys: Keys) -> None:
    registry = Registry(client, keys)
    registry.publish("worker0@host", [], {}, loading=["synthetic", "resnet18"])
    beats: list[float] = []

    def pause(_: float) -> None:  # it finishes loading during the first pause
        beats.append(1.0)
        registry.publish("worker0@host", ["synthetic"], {"resnet18": NO_WEIGHTS})

    live, missing = wait_registered(registry, ["worker0"], 60.0, lambda: None, pause)
    assert missing == [] and len(beats) == 1
    assert live[0].served == ("synthetic",) and live[0].loading == ()


def test_a_worker_not_registered_shows_its_models_loading_and_is_named_at_the_bound(
        redis_url: str, key_prefix: str, client: redis.Redis, keys: Keys) -> None:
    Registry(client, keys).publish("worker0@host", ["synthetic"], {})
    said: list[str] = []
    with pytest.raises(CarpoolError, match=r"worker1 did not register .* logs/worker1\.log"):
        report_until_ready(make_env(redis_url, key_prefix, CARPOOL_MODELS="synthetic"),
                           ["worker0", "worker1"], "logs", check=lambda: None,
                           pause=threading.Event().wait, say=said.append, timeout_s=0.3)
    assert said[0] == "model   synthetic  served (worker0@host)"
    assert not any(line.startswith("ready") for line in said)
    said.clear()
    with pytest.raises(CarpoolError):
        report_until_ready(make_env(redis_url, key_prefix, CARPOOL_MODELS="resnet18"),
                           ["worker0", "worker1"], "logs", check=lambda: None,
                           pause=threading.Event().wait, say=said.append, timeout_s=0.3)
    assert said[0] == "model   resnet18  loading (worker1 not registered yet)"


def test_carpool_up_prints_each_model_and_sends_the_demo_job_once_the_worker_registered(
        tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "carpool.cli", "up", "--demo", "--once", "--no-flower",
             "--port", str(free_port()), "--redis-url", server.url,
             "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, timeout=180, cwd=Path(__file__).parents[2],
            env={**os.environ, "CARPOOL_WORKER_METRICS_PORT": "0"})
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    ready = next(i for i, line in enumerate(lines) if line.startswith("ready   "))
    submit = next(i for i, line in enumerate(lines) if line.startswith("POST /submit"))
    assert ready < submit, proc.stdout  # the job goes once the registry lists the worker
    states = {line.split()[1]: line for line in lines[:ready] if line.startswith("model   ")}
    assert "served (worker0@" in states["synthetic"], proc.stdout
    assert "refused by worker0@" in states["resnet18"] and "has no weights" in states["resnet18"]
    assert "served (worker0@" in states["efficientnet_lite0"], proc.stdout
    assert '"status": "done"' in proc.stdout
