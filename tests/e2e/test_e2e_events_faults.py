"""End to end, an event stream across a worker's death: ``kill -9`` of the worker running
the job; its successor (same name) takes the claim back and runs it again. The stream
tells the second run as a new ``running`` (attempts 2), then ``done``, from one stream."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from carpool.backend.connection import connect
from carpool.client.sse import Event, SseParser
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import start_web, start_worker

WAIT_S = 90.0
ONE_TOML = """
[models.one]
kind = "synthetic"
measure = "size"
[[models.one.bins]]
name = "only"
max_size = 10
max_batch = 1
max_wait_ms = 1
max_depth = 100
"""


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    cfg = tmp_path / "catalogue.toml"
    cfg.write_text(ONE_TOML)
    env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}", CARPOOL_CONFIG=str(cfg),
                   CARPOOL_MODELS="one")
    yield env
    client = connect(REDIS_URL)
    keys = list(client.scan_iter(match="{" + env["CARPOOL_KEY_PREFIX"] + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_a_stream_tells_a_second_run_after_its_worker_was_killed(env: dict[str, str]) -> None:
    events: list[Event] = []
    with start_web(env) as base:
        job = httpx.post(f"{base}/submit", json={"model": "one", "input": {
            "value": 1, "size": 1}}, timeout=10).json()["id"]

        def follow() -> None:
            parser = SseParser()
            with httpx.stream("GET", f"{base}/result/{job}/events", timeout=WAIT_S) as r:
                for line in r.iter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        events.append(event)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        # The first worker's batch takes 60 s: it is running when it dies.
        with start_worker({**env, "CARPOOL_SYNTHETIC_COST_MS": "60000,0"},
                          node_name="w1@events-fault") as first:
            wait_until(lambda: any(e.event == "running" for e in events), WAIT_S,
                       "the first run to start")
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        with start_worker({**env, "CARPOOL_SYNTHETIC_COST_MS": "50,0"},
                          node_name="w1@events-fault"):
            reader.join(WAIT_S)
    names = [(e.event, e.data.get("attempts")) for e in events]
    assert names[0] == ("queued", 0) and names[-1] == ("done", 2), names
    assert ("running", 1) in names and ("running", 2) in names, names
    ids = [e.id for e in events]
    assert ids == sorted(ids), ids  # versions grow: 0, 1, (2), 3, 5
