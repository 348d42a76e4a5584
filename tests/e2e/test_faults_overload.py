"""A flood at 10x a bin's bound, through real gunicorn with a real worker running:
exactly the bound is admitted, the rest answer 429 with Retry-After, a refused
submit writes nothing to Redis, and no process's memory grows round after round.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.jobs import JobStatus
from tests.conftest import make_env
from tests.support.faults import all_final, record
from tests.support.procs import (
    WEB_START_TIMEOUT_S,
    answers,
    free_port,
    running,
    start_worker,
    wait_until,
    web_command,
)
from tests.support.redisproc import RedisProc, private_redis

#: A model no worker serves, so its one bin stays full once filled.
FLOOD_TOML = """
[models.flood]
kind = "synthetic"
measure = "size"
[[models.flood.bins]]
name = "only"
max_size = 10
max_batch = 8
max_wait_ms = 20
max_depth = 200
"""
BOUND = 200
FLOOD = 10 * BOUND
CLIENTS = 16
#: Synthetic jobs the worker runs each round, so its memory is exercised too.
WORKED_PER_ROUND = 300
ROUNDS = 3
#: Growth of resident memory from the first round to the last that still reads as
#: flat: allocator noise, not a leak (a leak of even 1 KB per request would show
#: several MB over the rounds).
FLAT_MB = 12.0
#: What refused submits may add to Redis's memory: nothing but allocator noise.
REDIS_FLAT_BYTES = 200_000


@dataclass
class Stack:
    base: str
    web_pid: int
    worker_pid: int
    server: RedisProc
    queue: Queue


@pytest.fixture
def stack(tmp_path: Path, key_prefix: str) -> Iterator[Stack]:
    config = tmp_path / "catalogue.toml"
    config.write_text(FLOOD_TOML)
    with private_redis("--maxmemory", "512mb", "--maxmemory-policy", "noeviction") as server:
        env = make_env(server.url, key_prefix, CARPOOL_CONFIG=str(config),
                       CARPOOL_SYNTHETIC_COST_MS="2,0.05",
                       # The bin's bound is under test, not the web's own shedding,
                       # which a busy machine trips with 503s (test_web_shedding*).
                       CARPOOL_WEB_MAX_QUEUE_MS="0")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        web_env = {**env, "CARPOOL_WEB_BIND": f"127.0.0.1:{port}"}
        with running(web_command(), web_env, lambda: answers(f"{base}/healthz"), "gunicorn",
                     WEB_START_TIMEOUT_S) as web, \
                start_worker({**env, "CARPOOL_MODELS": "synthetic"}, "w1@flood") as worker:
            client = connect(server.url)
            yield Stack(base, web.pid, worker.pid, server, Queue(client, Keys(key_prefix)))
            client.close()


def rss_mb(pid: int) -> float:
    """Resident memory of a process and all its children, in MiB."""
    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs) / (1 << 20)


def flood(base: str) -> tuple[Counter[int], list[str], bool]:
    """FLOOD submits from CLIENTS threads: statuses, admitted ids, all 429s had Retry-After."""
    codes: Counter[int] = Counter()
    ids: list[str] = []
    retry_after_ok = True
    lock = threading.Lock()
    per_client = FLOOD // CLIENTS

    def client(c: int) -> None:
        nonlocal retry_after_ok
        with requests.Session() as s:
            for i in range(per_client):
                r = s.post(f"{base}/submit", json={"model": "flood",
                                                   "input": {"value": [c, i], "size": 1}},
                           timeout=30)
                with lock:
                    codes[r.status_code] += 1
                    if r.status_code == 202:
                        ids.append(r.json()["id"])
                    elif r.status_code == 429 and int(r.headers.get("Retry-After", 0)) < 1:
                        retry_after_ok = False

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes, ids, retry_after_ok


def work(stack: Stack, s: requests.Session, round_no: int) -> None:
    """WORKED_PER_ROUND synthetic jobs through /submit/batch, run by the worker."""
    inputs: list[dict[str, Any]] = [{"value": [round_no, i], "size": 1 + i % 500}
                                    for i in range(WORKED_PER_ROUND)]
    jobs = s.post(f"{stack.base}/submit/batch", json={"model": "synthetic", "inputs": inputs},
                  timeout=60).json()["jobs"]
    ids = [j["id"] for j in jobs]
    wait_until(lambda: all_final(stack.queue, ids), 120, "the round's jobs to be run")
    assert {stack.queue.get(i).status for i in ids} == {JobStatus.DONE}  # type: ignore[union-attr]


def empty_flood_bin(stack: Stack, s: requests.Session, ids: list[str]) -> None:
    for job_id in ids:
        assert s.delete(f"{stack.base}/result/{job_id}", timeout=10).status_code == 200


def test_flood_at_10x_the_bound_admits_exactly_the_bound_and_memory_stays_flat(
        stack: Stack) -> None:
    web_mb, worker_mb, refused_bytes = [], [], []
    with requests.Session() as s, stack.server.client() as redis_client:
        for round_no in range(ROUNDS):
            before = int(redis_client.info("memory")["used_memory"])
            codes, ids, retry_after_ok = flood(stack.base)
            assert codes == {202: BOUND, 429: FLOOD - BOUND}, codes
            assert retry_after_ok
            assert stack.queue.depths([("flood", "only")]) == [BOUND]
            refused_bytes.append(int(redis_client.info("memory")["used_memory"]) - before
                                 - _admitted_bytes(redis_client, stack, ids))
            work(stack, s, round_no)
            empty_flood_bin(stack, s, ids)
            web_mb.append(round(rss_mb(stack.web_pid), 1))
            worker_mb.append(round(rss_mb(stack.worker_pid), 1))
    # Round 0 warms Redis up (script cache, client buffers, the stats hash).
    assert max(refused_bytes[1:]) < REDIS_FLAT_BYTES, refused_bytes
    assert web_mb[-1] - web_mb[0] < FLAT_MB, web_mb
    assert worker_mb[-1] - worker_mb[0] < FLAT_MB, worker_mb
    record("flood at 10x the bin bound, 3 rounds (with a worker running 300 jobs a round)",
           requests_per_round=FLOOD, admitted=BOUND, refused_429=FLOOD - BOUND,
           web_rss_mb=web_mb, worker_rss_mb=worker_mb,
           redis_bytes_beyond_admitted_jobs=refused_bytes)


def _admitted_bytes(redis_client: Any, stack: Stack, ids: list[str]) -> int:
    """What Redis holds for the admitted jobs (their hashes and bin), to subtract."""
    keys = [stack.queue.keys.job(i) for i in ids] + [stack.queue.keys.bin("flood", "only")]
    return sum(int(redis_client.memory_usage(k) or 0) for k in keys)
