"""End to end: scheduling through real gunicorn, a real Celery worker and Redis.

What reached the model is read from the synthetic model's call log
(CARPOOL_SYNTHETIC_CALL_LOG, test-only: one JSON line of input values per model
call). Orders are made deterministic by pausing the model with the remote-control
command, queueing, then resuming: no sleeps, only bounded waits on conditions.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from celery import Celery

from carpool.admission.retry_after import drain_rate_per_s, retry_after_s
from carpool.backend import records
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import start_web, start_worker, wait_until

#: A second model whose two bins differ only in depth, for Retry-After.
LANE_TOML = """
[models.lane]
kind = "synthetic"
measure = "size"
[[models.lane.bins]]
name = "a"
max_size = 10
max_batch = 4
max_wait_ms = 5
max_depth = 30
[[models.lane.bins]]
name = "b"
max_size = 20
max_batch = 4
max_wait_ms = 5
max_depth = 120
"""
#: Bound on one control round trip to the worker.
CONTROL_TIMEOUT_S = 10.0


@dataclass
class Stack:
    url: str
    node: str
    call_log: Path
    celery: Celery
    client: redis.Redis
    keys: Keys
    http: requests.Session

    def tune(self, model: str, *changes: str) -> list[dict[str, Any]]:
        replies = self.celery.control.broadcast(
            "carpool_tune", arguments={"model": model, "changes": list(changes)},
            destination=[self.node], reply=True, timeout=CONTROL_TIMEOUT_S)
        assert len(replies) == 1, replies
        reply = replies[0][self.node]
        assert "ok" in reply, reply
        return reply["bins"]  # type: ignore[no-any-return]

    def inspect(self) -> list[dict[str, Any]]:
        replies = self.celery.control.broadcast(
            "carpool_scheduler", destination=[self.node], reply=True, timeout=CONTROL_TIMEOUT_S)
        return replies[0][self.node]["bins"]  # type: ignore[no-any-return]

    def submit(self, value: Any, model: str = "synthetic", size: int = 1,
               **options: Any) -> requests.Response:
        body = {"model": model, "input": {"value": value, "size": size}, **options}
        return self.http.post(f"{self.url}/submit", json=body, timeout=30)

    def result(self, job_id: str) -> dict[str, Any]:
        view = self.http.get(f"{self.url}/result/{job_id}?wait=20", timeout=40).json()
        assert view["status"] not in ("queued", "running"), view
        return view  # type: ignore[no-any-return]

    def calls(self) -> list[list[Any]]:
        text = self.call_log.read_text() if self.call_log.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def redis_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def fresh(self) -> None:
        """Catalogue limits back, and an empty call log."""
        self.tune("synthetic", "reset=1")
        self.tune("lane", "reset=1")
        self.call_log.write_text("")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("sched")
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    (tmp / "catalogue.toml").write_text(LANE_TOML)
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp / "catalogue.toml"),
                   CARPOOL_SYNTHETIC_COST_MS="5,0.2",
                   CARPOOL_SYNTHETIC_CALL_LOG=str(tmp / "calls.jsonl"))
    node = f"sched-{prefix}@carpool-test"
    client = connect(REDIS_URL)
    celery = Celery("carpool-test", broker=REDIS_URL)
    try:
        with start_web(env) as url, start_worker(env, node), requests.Session() as http:
            yield Stack(url, node, tmp / "calls.jsonl", celery, client, Keys(prefix), http)
    finally:
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
        client.close()
        celery.close()


def test_jobs_whose_deadline_passed_while_queued_never_reach_the_model(stack: Stack) -> None:
    stack.fresh()
    stack.tune("synthetic", "paused=on")
    doomed = [stack.submit(f"doomed-{i}", deadline_ms=200).json()["id"] for i in range(5)]
    kept = [stack.submit(f"kept-{i}").json()["id"] for i in range(3)]
    last = max(int((records.read(stack.client, stack.keys.job(j)) or {})["deadline"])
               for j in doomed)
    wait_until(lambda: stack.redis_ms() > last, 10, "the deadlines to pass")
    stack.tune("synthetic", "paused=off")
    for job_id in doomed:
        view = stack.result(job_id)
        assert (view["status"], view["error"]) == ("expired", "deadline passed while queued")
    assert all(stack.result(j)["status"] == "done" for j in kept)
    reached = sorted(v for call in stack.calls() for v in call)
    assert reached == ["kept-0", "kept-1", "kept-2"]


def test_jobs_run_earliest_deadline_first_and_equal_deadlines_in_order(stack: Stack) -> None:
    stack.fresh()
    stack.tune("synthetic", "paused=on", "max_batch=1", "max_wait_ms=0", "adaptive=off")
    plan = [("d50", 50_000), ("d20a", 20_000), ("none", None), ("d30", 30_000), ("d20b", 20_000)]
    ids = [stack.submit(v, **({} if d is None else {"deadline_ms": d})).json()["id"]
           for v, d in plan]
    stack.tune("synthetic", "paused=off")
    assert all(stack.result(j)["status"] == "done" for j in ids)
    assert stack.calls() == [["d20a"], ["d20b"], ["d30"], ["d50"], ["none"]]


def test_higher_priorities_run_first(stack: Stack) -> None:
    stack.fresh()
    stack.tune("synthetic", "paused=on", "max_batch=2", "max_wait_ms=0", "adaptive=off")
    plan = [("p0a", 0), ("p5a", 5), ("p0b", 0), ("p9", 9), ("p5b", 5)]
    ids = [stack.submit(v, priority=p).json()["id"] for v, p in plan]
    stack.tune("synthetic", "paused=off")
    assert all(stack.result(j)["status"] == "done" for j in ids)
    assert stack.calls() == [["p9", "p5a"], ["p5b", "p0a"], ["p0b"]]


def test_a_control_command_changes_the_next_batch_and_inspect_shows_it(stack: Stack) -> None:
    stack.fresh()
    bins = stack.tune("synthetic", "bin=small", "paused=on", "max_batch=3", "max_wait_ms=0",
                      "adaptive=off")
    assert [(b["bin"], b["max_batch"], b["adaptive"]) for b in bins] == [("small", 3, False)]
    ids = [stack.submit(f"j{i}").json()["id"] for i in range(7)]
    stack.tune("synthetic", "bin=small", "paused=off")
    assert all(stack.result(j)["status"] == "done" for j in ids)
    assert [len(call) for call in stack.calls()] == [3, 3, 1]
    small = next(b for b in stack.inspect() if (b["model"], b["bin"]) == ("synthetic", "small"))
    assert small["max_batch"] == 3 and small["recent_batch_sizes"][-3:] == [3, 3, 1]
    assert small["cost_ms"]["batches"] >= 3


def test_retry_after_is_the_bins_depth_over_its_drain_rate(stack: Stack) -> None:
    stack.fresh()
    ids = [stack.submit(f"warm-{i}", model="lane", size=size).json()["id"]
           for i in range(12) for size in (1, 15)]
    assert all(stack.result(j)["status"] == "done" for j in ids)
    stack.tune("lane", "paused=on")
    answers = {}
    for bin_name, size in (("a", 1), ("b", 15)):
        while (r := stack.submit("fill", model="lane", size=size)).status_code == 202:
            pass
        assert r.status_code == 429
        stats = stack.client.hgetall(stack.keys.stats("lane", bin_name))
        decay = math.exp(-(stack.redis_ms() - int(stats["rate_t"])) / 10_000)
        rate = drain_rate_per_s(float(stats["rate_c"]) * decay,
                                stack.redis_ms() - int(stats["rate_t0"]))
        depth = {"a": 30, "b": 120}[bin_name]
        assert abs(int(r.headers["Retry-After"]) - retry_after_s(depth, rate)) <= 1
        answers[bin_name] = int(r.headers["Retry-After"])
    assert answers["b"] > answers["a"]  # four times the depth, the same drain history
    stack.tune("lane", "paused=off")
