"""Per-job costs of the skeleton: Redis commands and CPU time on the submit path and
in the worker loop, and one worker's drain throughput against its analytical limit.

    python ops/bench/costs.py --jobs 3000

Runs a private redis-server (so INFO commandstats counts only this run), a real
gunicorn and a real Celery worker. Phase 1 submits N synthetic jobs over HTTP
with no worker running; phase 2 starts one worker and lets it drain them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import redis
import requests

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.core.shards import shard
from carpool.core.synthetic import batch_cost_s
from carpool.stack.localstack import web_command, worker_command
from carpool.stack.redis_local import free_port, start_redis
from carpool.stack.waiting import wait_until

#: Bound on each phase; a run that needs longer is broken, not slow.
PHASE_TIMEOUT_S = 300.0
#: This run's keys, under their own prefix.
KEYS = Keys("costs")


def commandstats(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in r.info("commandstats").items()}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


def tree_cpu_s(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def loop_thread_cpu_s(log_text: str) -> float:
    """CPU of the worker's batch-loop thread alone, as the loop logs it when it ends."""
    match = re.search(r"batch loop ended: \d+ batches, \d+ jobs, ([\d.]+) s CPU", log_text)
    if match is None:
        raise RuntimeError("the worker log has no 'batch loop ended' line")
    return float(match.group(1))


def wait_for(pred: Callable[[], bool], what: str) -> None:
    wait_until(pred, PHASE_TIMEOUT_S, what)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--cost-ms", default="20,1")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="carpool-costs-"))
    server = start_redis(tmp / "redis")
    r = redis.Redis.from_url(server.url, decode_responses=True)  # records are text
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, CARPOOL_REDIS_URL=server.url, CARPOOL_WEB_BIND=f"127.0.0.1:{port}",
               CARPOOL_SYNTHETIC_COST_MS=args.cost_ms, CARPOOL_KEY_PREFIX=KEYS.prefix,
               CARPOOL_MODELS="synthetic")  # no torch model loads into the figures
    logs = open(tmp / "procs.log", "ab")  # noqa: SIM115
    web = subprocess.Popen(web_command(), env=env, stdout=logs, stderr=subprocess.STDOUT)
    worker = None
    try:
        wait_for(lambda: _ok(f"{base}/healthz"), "web start")
        sess = requests.Session()
        sess.post(f"{base}/submit", json={"model": "synthetic", "input": {"value": 0, "size": 1}})
        web_ps = psutil.Process(web.pid)
        cpu0, cmd0 = tree_cpu_s(web_ps), commandstats(r)
        bodies = [{"model": "synthetic", "input": {"value": i, "size": 8}}
                  for i in range(args.jobs)]
        t0 = time.perf_counter()

        def post(chunk: list[dict[str, object]]) -> int:
            with requests.Session() as s:
                return sum(s.post(f"{base}/submit", json=b).status_code == 202 for b in chunk)

        chunks = [bodies[i::args.clients] for i in range(args.clients)]
        with ThreadPoolExecutor(args.clients) as pool:
            accepted = sum(pool.map(post, chunks))
        submit_s = time.perf_counter() - t0
        web_cpu = tree_cpu_s(web_ps) - cpu0
        submit_cmds = delta(commandstats(r), cmd0)
        # Phase 2: one worker drains the backlog (+1 for the warm-up job).
        total = accepted + 1
        cmd1 = commandstats(r)
        worker = subprocess.Popen(worker_command(0), env=env, stdout=logs,
                                  stderr=subprocess.STDOUT)
        stats_key = KEYS.stats("synthetic", "small")
        wait_for(lambda: int(r.hget(stats_key, "drained") or 0) >= total, "drain")
        worker_cmds = delta(commandstats(r), cmd1)
        worker_cpu = tree_cpu_s(psutil.Process(worker.pid))
        worker.terminate()
        worker.wait(timeout=30)
        logs.flush()
        loop_cpu = loop_thread_cpu_s((tmp / "procs.log").read_text(errors="replace"))
        done = _done_times(r)
        span_ms = max(d for _, d in done) - min(c for c, _ in done)
        a_ms, b_ms = (float(x) for x in args.cost_ms.split(","))
        limit = 32 / batch_cost_s(32, a_ms, b_ms)
        report = {
            "jobs": total, "submit": {
                "rate_per_s": round(accepted / submit_s, 1),
                "web_cpu_ms_per_job": round(1000 * web_cpu / accepted, 3),
                "redis_calls_per_job": round(sum(submit_cmds.values()) / accepted, 2),
                "redis_calls": {k: round(v / accepted, 2) for k, v in submit_cmds.items()}},
            "worker": {
                "drain_rate_per_s": round(total / (span_ms / 1000), 1),
                "limit_per_s": round(limit, 1),
                "fraction_of_limit": round(total / (span_ms / 1000) / limit, 3),
                "loop_cpu_ms_per_job": round(1000 * loop_cpu / total, 3),
                "worker_process_cpu_ms_per_job": round(1000 * worker_cpu / total, 3),
                "redis_calls_per_job": round(sum(worker_cmds.values()) / total, 2),
                "redis_calls": {k: round(v / total, 3) for k, v in worker_cmds.items()}},
        }
        print(json.dumps(report, indent=2))
        return 0
    finally:
        for p in (worker, web):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        logs.close()
        server.stop()


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _done_times(r: redis.Redis) -> list[tuple[int, int]]:
    out = []
    for key in r.scan_iter(match=KEYS.job_pattern(shard("synthetic")), count=1000):
        record = records.read(r, key) or {}
        claim, done = record.get("t_claim"), record.get("t_done")
        if claim and done:
            out.append((int(claim), int(done)))
    return out


if __name__ == "__main__":
    sys.exit(main())
