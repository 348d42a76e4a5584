"""`carpool up --workers 1..3` grows its pool under load and shrinks it back, each
worker it stops by a warm shutdown: real Redis, gunicorn and Celery workers; the
synthetic model at a, b = 300, 5 ms makes the load cheap (one worker: ~70 jobs/s)."""

from __future__ import annotations

import re
from pathlib import Path

import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.stack.waiting import wait_until
from tests.e2e.test_supervisor import carpool_up
from tests.support.procs import free_port, log_says
from tests.support.redisproc import private_redis

SCALING_ENV = {
    "CARPOOL_MODELS": "synthetic", "CARPOOL_KEY_PREFIX": "up-scaled",
    "CARPOOL_SYNTHETIC_COST_MS": "300,5", "CARPOOL_WORKER_METRICS_PORT": "0",
    # Before a worker measured its own: the rule's cold start; and a short hold-down,
    # so the pool shrinks within the test (30 s by default).
    "CARPOOL_COLD_START_S": "5", "CARPOOL_SCALE_HOLD_DOWN_S": "3",
}


def admit(base: str, values: range) -> list[str]:
    """One /submit/batch call; the ids it admitted (a refused item has no id)."""
    answer = requests.post(f"{base}/submit/batch", timeout=30, json={
        "model": "synthetic", "inputs": [{"value": v, "size": 1} for v in values]})
    return [item["id"] for item in answer.json()["jobs"] if "id" in item]


def status(base: str, job_id: str) -> str:
    return str(requests.get(f"{base}/result/{job_id}", timeout=10).json()["status"])


def test_the_pool_grows_under_load_shrinks_after_and_loses_no_admitted_job(
        tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "up.out"
    base = f"http://127.0.0.1:{port}"
    with private_redis() as redis_server, carpool_up(
            ["--workers", "1..3", "--no-flower", "--port", str(port), "--redis-url",
             redis_server.url, "--state-dir", str(tmp_path / "state")],
            SCALING_ENV, out) as up:
        wait_until(lambda: up.poll() is not None or log_says(out, "carpool is up"), 120,
                   "carpool up to be up")
        assert up.poll() is None, out.read_text()
        assert log_says(out, "scale   1..3 workers by need")
        # ~14 s of one worker's work, due within max_queue_ms (5 s): the rule wants more.
        ids = [i for start in range(0, 960, 96) for i in admit(base, range(start, start + 96))]
        assert len(ids) >= 500, "the burst was mostly refused"
        wait_until(lambda: log_says(out, "scale   1 -> "), 30, "the pool to grow")
        grew = next(line for line in out.read_text().splitlines()
                    if line.startswith("scale   1 -> "))
        assert "starting worker1" in grew and "synthetic needs" in grew, grew
        # Admission was told when the new workers serve (coming.lua).
        stats = connect(redis_server.url).hgetall(Keys("up-scaled").model_stats("synthetic"))
        assert int(stats["coming_n"]) >= 1, stats
        # A trickle while the pool shrinks: a worker told to stop may hold one of these.
        trickle: list[str] = []

        def stopped_one() -> bool:
            trickle.extend(admit(base, range(10_000 + len(trickle), 10_004 + len(trickle))))
            return re.search(r"worker[12] stopped \(exited with code 0\)",
                             out.read_text()) is not None

        wait_until(stopped_one, 90, "a worker to stop after the load", poll_s=0.25)
        shrank = [line for line in out.read_text().splitlines() if " workers, stopping " in line]
        assert shrank and "(warm shutdown)" in shrank[0], out.read_text()
        for job_id in ids + trickle:  # every admitted job, none lost as workers stopped
            wait_until(lambda: status(base, job_id) == "done", 60,  # noqa: B023
                       f"job {job_id} to be done")
        assert (tmp_path / "state" / "scaling.log").read_text().count("scale   ") >= 2
        assert up.poll() is None
