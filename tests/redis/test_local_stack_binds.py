"""`carpool up` keeps a laptop's endpoints on loopback: the workers' metrics too, not
only the web and Flower; and a worker's metrics endpoint listens where it is told."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from carpool.core.settings import load_settings
from carpool.stack import localstack
from carpool.stack.localstack import UpOptions, start_stack
from carpool.stack.scaling import Bounds
from tests.conftest import REDIS_URL
from tests.support.procs import free_port


def test_carpool_up_binds_worker_metrics_to_loopback_and_shows_batch_args_in_flower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CARPOOL_WORKER_METRICS_ADDR", raising=False)
    spawned: dict[str, tuple[list[str], dict[str, str]]] = {}

    def spawn(self: Any, name: str, cmd: list[str], env: dict[str, str]) -> None:
        spawned[name] = (cmd, env)  # recorded, not started

    monkeypatch.setattr(localstack.Stack, "spawn", spawn)
    opts = UpOptions(port=free_port(), redis_url=REDIS_URL, workers=Bounds(2, 2), flower=True,
                     flower_port=free_port(), models="", state_dir=tmp_path)
    start_stack(opts)
    for name in ("worker0", "worker1"):
        env = spawned[name][1]
        assert load_settings(env).worker_metrics_addr == "127.0.0.1", name
    flower_cmd = spawned["flower"][0]
    columns = next(a for a in flower_cmd if a.startswith("--tasks_columns=")).split("=")[1]
    assert {"args", "result"} <= set(columns.split(","))


def test_worker_metrics_listen_on_the_address_they_are_given() -> None:
    from worker.observe.metrics import WorkerMetrics

    metrics = WorkerMetrics({}, limits=dict)
    server = metrics.serve(free_port(), "127.0.0.1")
    try:
        assert server.server.server_address[0] == "127.0.0.1"
    finally:
        server.close()


def test_containers_keep_listening_on_every_interface_by_default() -> None:
    assert load_settings({}).worker_metrics_addr == "0.0.0.0"
    assert socket.inet_aton(load_settings({}).worker_metrics_addr)  # a literal address
