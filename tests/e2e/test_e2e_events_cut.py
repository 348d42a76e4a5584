"""End to end, the client's event stream cut mid-read: gunicorn's workers are killed
(``kill -9``) while ``Client.events`` (and ``AsyncClient.events``) reads a stream of two
jobs, one already cancelled; the master starts new ones, the client reconnects with
``Last-Event-ID`` and reads on until the other is done: each final state once, no error."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from carpool.backend.connection import connect
from carpool.client import AsyncClient, Client, RetryPolicy
from carpool.client.sse import Event
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import (
    WEB_START_TIMEOUT_S,
    answers,
    free_port,
    running,
    start_worker,
    web_command,
)

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
                   CARPOOL_MODELS="one", CARPOOL_WEB_WORKERS="2")
    yield env
    client = connect(REDIS_URL)
    keys = list(client.scan_iter(match="{" + env["CARPOOL_KEY_PREFIX"] + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (gunicorn's workers, for its master)."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def follow(base: str, ids: list[str], asynchronous: bool, events: list[Event],
           errors: list[BaseException]) -> None:
    """Every event of ``ids``' stream into ``events``; what it raised into ``errors``."""
    policy = RetryPolicy()  # the default bounds: a restart of workers fits in them

    async def read_async() -> None:
        async with AsyncClient(base, retry=policy) as c:
            async for event in c.events(ids):
                events.append(event)

    try:
        if asynchronous:
            asyncio.run(read_async())
        else:
            with Client(base, retry=policy) as c:
                events.extend(c.events(ids))  # appended as they come: extend iterates
    except BaseException as exc:  # noqa: BLE001 — the test reports it
        errors.append(exc)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_stream_cut_mid_read_resumes_and_tells_each_end_once(
        env: dict[str, str], asynchronous: bool) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    events: list[Event] = []
    errors: list[BaseException] = []
    with running(web_command(), {**env, "CARPOOL_WEB_BIND": f"127.0.0.1:{port}"},
                 lambda: answers(f"{base}/healthz"), "gunicorn", WEB_START_TIMEOUT_S) as web:
        ids = [httpx.post(f"{base}/submit", json={"model": "one", "input": {
            "value": i, "size": 1}}, timeout=10).json()["id"] for i in range(2)]
        assert httpx.delete(f"{base}/result/{ids[0]}", timeout=10).status_code == 200
        reader = threading.Thread(target=follow, args=(base, ids, asynchronous, events,
                                                       errors), daemon=True)
        reader.start()
        wait_until(lambda: {"cancelled", "queued"} <= {e.event for e in events}, WAIT_S,
                   "the stream to tell the cancel and the queued job")
        workers = children(web.pid)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        # The master starts new workers on the same socket; the client reconnects to them.
        wait_until(lambda: len(set(children(web.pid)) - set(workers)) >= 2, WAIT_S,
                   "new gunicorn workers")
        with start_worker({**env, "CARPOOL_SYNTHETIC_COST_MS": "50,0"},
                          node_name="w1@events-cut"):
            reader.join(WAIT_S)
    assert not reader.is_alive(), [(e.event, e.data.get("id")) for e in events]
    assert errors == [], errors
    ends = [(e.event, e.data["id"]) for e in events if e.event in ("cancelled", "done")]
    assert sorted(ends) == sorted([("cancelled", ids[0]), ("done", ids[1])]), ends
