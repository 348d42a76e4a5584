"""Interactive load beside a bulk batch: latency with and without, and the bulk batch's share.

    python ops/bench/bulk_beside.py --cost-ms 200,2 --load 0.5 --duration 20 --out b.json

Starts a private redis-server, the web under gunicorn, one Celery worker serving the
synthetic model and the feeder. The synthetic model's capacity is exact: its small
bin's full batch (32) takes a + 32·b ms, so it serves ``32 / (a + 32 b)`` jobs/s.
Phase 1 drives open-loop Poisson arrivals at ``--load`` × that capacity (submit,
then long-poll; each job's latency from its scheduled arrival). Phase 2 starts a
batch of ``/submit`` lines on the same bin, waits until it is in progress, then
drives the same arrivals again. Reported: the interactive p50/p99 of each phase,
their ratio (goal ≤ 1.2), and the lines the batch stored per second during phase 2
against the capacity the interactive load leaves (capacity − offered; goal ≥ 80 %).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from carpool.bench.arrivals import Arrival, poisson_times
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.records import JobRecord, Outcome
from carpool.bench.workload import new_nonce
from carpool.stack.localstack import web_command, worker_command
from carpool.stack.redis_local import free_port, start_redis
from carpool.stack.waiting import wait_until

FULL_BATCH = 32  # the synthetic model's small bin
START_TIMEOUT_S = 120.0


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def latency(records: Sequence[JobRecord]) -> dict[str, Any]:
    ok = [r.e2e_ms for r in records if r.outcome is Outcome.OK and r.e2e_ms is not None]
    return {"offered": len(records), "done": len(ok), "p50_ms": round(percentile(ok, 0.5), 1),
            "p99_ms": round(percentile(ok, 0.99), 1),
            "mean_batch": round(statistics.mean(r.batch_size for r in records
                                                if r.outcome is Outcome.OK) or 0, 1)}


def batch_lines(n: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/submit",
                               "body": {"model": "synthetic",
                                        "input": {"value": i, "size": 16}}}) + "\n"
                   for i in range(n)).encode()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost-ms", default="200,2", help="synthetic a,b: a + b·n ms per batch")
    ap.add_argument("--load", type=float, default=0.5, help="interactive load, × capacity")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    ap.add_argument("--lines", type=int, default=20_000, help="lines in the batch")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    a_ms, b_ms = (float(x) for x in args.cost_ms.split(","))
    capacity = FULL_BATCH / ((a_ms + FULL_BATCH * b_ms) / 1000)
    rate = args.load * capacity
    tmp = Path(tempfile.mkdtemp(prefix="carpool-batch-bench-"))
    server = start_redis(tmp / "redis")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, CARPOOL_REDIS_URL=server.url, CARPOOL_WEB_BIND=f"127.0.0.1:{port}",
               CARPOOL_SYNTHETIC_COST_MS=args.cost_ms, CARPOOL_MODELS="synthetic",
               CARPOOL_WORKER_METRICS_PORT="0", CARPOOL_FEEDER_METRICS_PORT="0",
               CARPOOL_FILES_DIR=str(tmp / "files"))
    procs = []
    try:
        with open(tmp / "procs.log", "ab") as logs:
            for cmd in (web_command(), worker_command(0), [sys.executable, "-m", "feeder"]):
                procs.append(subprocess.Popen(cmd, env=env, stdout=logs,
                                              stderr=subprocess.STDOUT))
        wait_until(lambda: _answers(f"{base}/models"), START_TIMEOUT_S, "the web")
        wait_until(lambda: bool(requests.post(f"{base}/submit?wait=5", timeout=10, json={
            "model": "synthetic", "input": {"value": 0, "size": 16}}).status_code == 200),
            START_TIMEOUT_S, "the worker")
        arrivals = [Arrival(t, 16) for t in poisson_times(rate, args.duration, seed=1)]
        opts = HttpOptions(base_url=base, client_timeout_s=10, grace_s=15)
        alone = latency(run_http(arrivals, opts, new_nonce()))
        f = requests.post(f"{base}/v1/files", data={"purpose": "batch"}, timeout=60,
                          files={"file": ("b.jsonl", io.BytesIO(batch_lines(args.lines)))})
        batch = requests.post(f"{base}/v1/batches", timeout=10, json={
            "input_file_id": f.json()["id"], "endpoint": "/submit",
            "completion_window": "24h"}).json()

        def doc() -> dict[str, Any]:
            return dict(requests.get(f"{base}/v1/batches/{batch['id']}", timeout=10).json())

        wait_until(lambda: doc()["request_counts"]["completed"] > 0, 60, "the batch to run")
        before, t0 = doc()["request_counts"]["completed"], time.monotonic()
        beside = latency(run_http(arrivals, opts, new_nonce()))
        after, t1 = doc()["request_counts"]["completed"], time.monotonic()
        batch_per_s = (after - before) / (t1 - t0)
        leftover = capacity - rate
        result = {
            "cost_ms": [a_ms, b_ms], "capacity_per_s": round(capacity, 1),
            "interactive_per_s": round(rate, 1), "alone": alone, "beside_batch": beside,
            "p99_ratio": round(beside["p99_ms"] / alone["p99_ms"], 2) if alone["p99_ms"] else None,
            "batch_lines_per_s": round(batch_per_s, 1), "leftover_per_s": round(leftover, 1),
            "batch_share_of_leftover": round(batch_per_s / leftover, 2),
            "batch_done_at_end": after, "batch_lines": args.lines,
        }
        print(json.dumps(result, indent=2))
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        server.stop()
    return 0


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    sys.exit(main())
