"""Web CPU per job: following a job by its event stream against long-polling it.

    python ops/bench/events_cpu.py --jobs 400 --clients 16

A private redis-server, a real gunicorn (its processes' CPU read with psutil) and one
real Celery worker (synthetic model). Each phase runs ``--jobs`` jobs, ``--clients``
at a time; a job is a ``POST /submit`` and then, in the long-poll phase, ``GET
/result/<id>?wait=30`` until final, in the stream phase ``GET /result/<id>/events``
read to its end (queued, running, done). The two phases alternate ``--rounds``
times, so a drift of the machine's load falls on both. Prints one JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

from carpool.stack.localstack import web_command, worker_command
from carpool.stack.redis_local import free_port, start_redis
from carpool.stack.waiting import wait_until

#: Bound on each start and phase; a run that needs longer is broken, not slow.
PHASE_TIMEOUT_S = 300.0
BODY = {"model": "synthetic", "input": {"value": 1, "size": 8}}


def tree_cpu_s(proc: psutil.Process) -> float:
    return float(sum(t.user + t.system for t in (p.cpu_times() for p in
                                                 [proc, *proc.children(recursive=True)])))


def by_long_poll(http: httpx.Client) -> str:
    job = http.post("/submit", json=BODY).json()
    while job["status"] not in ("done", "failed", "expired", "cancelled"):
        job = http.get(f"/result/{job['id']}", params={"wait": "30"}).json()
    return str(job["status"])


def by_stream(http: httpx.Client) -> str:
    job = http.post("/submit", json=BODY).json()
    last = ""
    with http.stream("GET", f"/result/{job['id']}/events") as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                last = line[len("event: "):]
    return last


def phase(base: str, web: psutil.Process, jobs: int, clients: int,
          follow: Callable[[httpx.Client], str]) -> dict[str, float]:
    def run(n: int) -> int:
        with httpx.Client(base_url=base, timeout=60) as http:
            return sum(follow(http) == "done" for _ in range(n))

    cpu0, t0 = tree_cpu_s(web), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = sum(pool.map(run, [jobs // clients] * clients))
    cpu_s, wall_s = tree_cpu_s(web) - cpu0, time.perf_counter() - t0
    return {"jobs_done": done, "web_cpu_ms_per_job": round(1000 * cpu_s / done, 3),
            "jobs_per_s": round(done / wall_s, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cost-ms", default="5,0.5")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="carpool-events-"))
    server = start_redis(tmp / "redis")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, CARPOOL_REDIS_URL=server.url, CARPOOL_WEB_BIND=f"127.0.0.1:{port}",
               CARPOOL_SYNTHETIC_COST_MS=args.cost_ms, CARPOOL_KEY_PREFIX="events-bench",
               CARPOOL_MODELS="synthetic", CARPOOL_WORKER_METRICS_PORT="0")
    logs = open(tmp / "procs.log", "ab")  # noqa: SIM115
    web = subprocess.Popen(web_command(), env=env, stdout=logs, stderr=subprocess.STDOUT)
    worker = subprocess.Popen(worker_command(0), env=env, stdout=logs, stderr=subprocess.STDOUT)
    try:
        def ready() -> bool:
            try:
                r = httpx.post(f"{base}/submit?wait=5", json=BODY, timeout=10)
                return r.status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, PHASE_TIMEOUT_S, "web and worker to answer a job")
        web_ps = psutil.Process(web.pid)
        report: dict[str, list[dict[str, float]]] = {"long_poll": [], "stream": []}
        for _ in range(args.rounds):
            report["long_poll"].append(phase(base, web_ps, args.jobs, args.clients,
                                             by_long_poll))
            report["stream"].append(phase(base, web_ps, args.jobs, args.clients, by_stream))
        print(json.dumps({"jobs_per_phase": args.jobs, "clients": args.clients,
                          "cost_ms": args.cost_ms, **report}, indent=2))
    finally:
        for proc in (worker, web):
            proc.terminate()
            proc.wait(timeout=30)
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
