"""Web CPU per job: ``POST /submit?wait=S`` (one round trip) against submit + long-poll.

    python ops/bench/web_cpu.py --jobs 2000 --clients 64 --rounds 2

Starts one real gunicorn (the shipped config) and one Celery worker (synthetic
model, cost a, b = 2, 0.05 ms, so the worker is never the limit) on a fresh key
prefix of the Redis at --redis-url. Each round drives --jobs jobs through each
mode in turn, closed loop with --clients concurrent clients (saturating the web
tier), and reads the CPU time of gunicorn's process tree before and after: CPU
per job is that delta over the jobs. Modes alternate within a round so that a
busy machine weighs on both alike.

    poll   POST /submit, then GET /result/<id>?wait=30 (two requests per job)
    wait   POST /submit?wait=30 (one request; 200 with the result)
    submit POST /submit alone (no result fetched): the admission path's own cost
    v2     POST /v2/models/synthetic/infer, one row of 8 floats (the Open Inference
           Protocol, docs/v2.md; one request; 200 with the outputs)

``--profile N`` instead profiles N in-process submits (Flask's test client, real
Redis, no gunicorn) with cProfile and prints where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import psutil

from carpool.bench.httpclient import HttpClient
from carpool.bench.policies import policy
from carpool.bench.stack import Stack, StackSpec

MODES = ("poll", "wait", "submit", "v2")
#: The worker's synthetic cost: far below the web's, so the web tier saturates first.
COST_MS = (2.0, 0.05)
#: ?wait= of every long-poll and inline wait: a bound, never reached here.
WAIT_S = 30


def tree_cpu_s(pid: int) -> float:
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        t = p.cpu_times()
        total += t.user + t.system
    return total


async def drive(base_url: str, mode: str, jobs: int, clients: int) -> int:
    """Run ``jobs`` jobs through ``mode``; the number that ended done."""
    http = HttpClient(base_url, max_connections=clients)
    todo = iter(range(jobs))
    done = 0

    async def client() -> None:
        nonlocal done
        for i in todo:
            if mode == "v2":  # the same size-8 job, as one row of a tensor
                row = [float(i)] + [0.0] * 7
                body = json.dumps({"inputs": [{"name": "VALUE", "datatype": "FP32",
                                               "shape": [1, 8], "data": row}]}).encode()
                answer = await http.request("POST", "/v2/models/synthetic/infer", body)
                done += answer.status == 200 and json.loads(answer.body)["outputs"][0][
                    "data"] == row
                continue
            body = json.dumps({"model": "synthetic", "input": {"value": i, "size": 8}}).encode()
            path = f"/submit?wait={WAIT_S}" if mode == "wait" else "/submit"
            answer = await http.request("POST", path, body)
            if mode == "poll" and answer.status == 202:
                job_id = json.loads(answer.body)["id"]
                answer = await http.request("GET", f"/result/{job_id}?wait={WAIT_S}")
            if mode == "submit" and answer.status == 202:
                done += 1
            elif answer.status == 200 and json.loads(answer.body)["status"] == "done":
                done += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    http.close()
    return done


def measure(args: argparse.Namespace) -> int:
    spec = StackSpec(policy("configured"), args.redis_url, cost_ms=COST_MS,
                     web_workers=args.web_workers)
    rows: dict[str, list[tuple[float, float, int]]] = {m: [] for m in args.modes}
    with TemporaryDirectory() as tmp, Stack(spec, Path(tmp)) as stack:
        web_pid = stack.procs[-1].pid  # the gunicorn master, started last
        asyncio.run(drive(stack.base_url, "wait", args.clients * 4, args.clients))  # warm up
        for _ in range(args.rounds):
            for mode in args.modes:
                cpu0, t0 = tree_cpu_s(web_pid), time.monotonic()
                ok = asyncio.run(drive(stack.base_url, mode, args.jobs, args.clients))
                cpu1, t1 = tree_cpu_s(web_pid), time.monotonic()
                rows[mode].append((cpu1 - cpu0, t1 - t0, ok))
    print(f"{args.jobs} jobs x {args.rounds} rounds per mode, {args.clients} clients")
    print("| mode | requests/job | web CPU per job (ms) | jobs/s | done |")
    print("|---|---|---|---|---|")
    per_job = {}
    for mode, runs in rows.items():
        cpu = sum(r[0] for r in runs)
        wall = sum(r[1] for r in runs)
        ok = sum(r[2] for r in runs)
        per_job[mode] = cpu / (args.jobs * len(runs)) * 1000
        reqs = 2 if mode == "poll" else 1
        print(f"| {mode} | {reqs} | {per_job[mode]:.3f} | {ok / wall:,.0f} | {ok} |")
    if "poll" in per_job and "wait" in per_job:
        print(f"wait / poll web CPU per job: {per_job['wait'] / per_job['poll']:.2f}")
    if "v2" in per_job and "wait" in per_job:
        print(f"v2 / wait web CPU per job: {per_job['v2'] / per_job['wait']:.2f}")
    return 0


def profile(args: argparse.Namespace) -> int:
    """In-process submits under cProfile: Flask, Werkzeug, JSON, redis-py, the metrics."""
    import os
    import uuid

    os.environ.setdefault("CARPOOL_REDIS_URL", args.redis_url)
    os.environ["CARPOOL_KEY_PREFIX"] = f"prof-{uuid.uuid4().hex[:8]}"
    from carpool.backend.connection import connect
    from web import create_app

    app = create_app()
    client = app.test_client()
    body = {"model": "synthetic", "input": {"value": 1, "size": 8}}
    for _ in range(200):
        client.post("/submit", json=body)
    prof = cProfile.Profile(time.process_time)  # CPU, not the wait for Redis
    prof.enable()
    for _ in range(args.profile):
        client.post("/submit", json=body)
    prof.disable()
    stats = pstats.Stats(prof).sort_stats("cumulative")
    stats.print_stats(40)
    r = connect(args.redis_url)
    stale = list(r.scan_iter(match="{" + os.environ["CARPOOL_KEY_PREFIX"] + "}*", count=1000))
    for i in range(0, len(stale), 1000):
        r.delete(*stale[i:i + 1000])
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2000, help="jobs per mode per round")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--web-workers", type=int, default=None, help="gunicorn -w (default 2)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--profile", type=int, default=0, help="profile this many submits instead")
    args = p.parse_args()
    return profile(args) if args.profile else measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
