"""Webhook delivery latency after completion, under load: real gunicorn, one Celery
worker, one dispatcher, a receiver on loopback.

    python ops/bench/webhook_latency.py --rate 500 --seconds 20

Submits ``--rate`` synthetic jobs a second (batches of ``--batch``, each with a webhook)
for ``--seconds``, on a private redis-server. The receiver notes when each delivery
arrives (this host's clock); the job's record says when its result was written
(``t_done``, Redis's clock on this same host). The latency of a job is the difference:
the time from its state change to the receiver's hands, outbox, lease, signature and
HTTP included. Prints p50, p90, p99 and max, and how many arrived.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from carpool.backend import records
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.stack.command_lines import python_argv
from carpool.stack.redis_local import free_port, start_redis
from carpool.stack.waiting import wait_until

SECRET = "whsec_" + "a" * 43


class Server(ThreadingHTTPServer):
    #: socketserver's default backlog of 5 drops SYNs under 32 concurrent connects, and
    #: each drop costs a 1 s retransmit: the receiver's limit, not the dispatcher's.
    request_queue_size = 1024


class Arrivals:
    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()


def receiver(arrivals: Arrivals) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            now = time.time()
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with arrivals.lock:
                arrivals.at.setdefault(self.headers["webhook-id"], now)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=500.0, help="jobs per second offered")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--batch", type=int, default=25, help="jobs per POST /submit/batch")
    p.add_argument("--concurrency", type=int, default=32, help="the dispatcher's")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="carpool-hookbench-"))
    redis_proc = start_redis(tmp / "redis")
    prefix = f"hookbench-{uuid.uuid4().hex[:8]}"
    web_port = free_port()
    env = {**os.environ, "CARPOOL_REDIS_URL": redis_proc.url, "CARPOOL_KEY_PREFIX": prefix,
           "CARPOOL_MODELS": "synthetic", "CARPOOL_SYNTHETIC_COST_MS": "5,0.2",
           "CARPOOL_WEBHOOK_ALLOW_PRIVATE": "1", "CARPOOL_WEBHOOK_SECRET": SECRET,
           "CARPOOL_DISPATCH_CONCURRENCY": str(args.concurrency),
           "CARPOOL_WEB_BIND": f"127.0.0.1:{web_port}", "CARPOOL_WEB_WORKERS": "2",
           "CARPOOL_WORKER_METRICS_PORT": "0", "CARPOOL_DISPATCH_METRICS_PORT": "0"}
    arrivals = Arrivals()
    rx = receiver(arrivals)
    hook = f"http://127.0.0.1:{rx.server_address[1]}/hook"
    procs = [subprocess.Popen(cmd, env=env, stdout=open(tmp / f"{name}.log", "wb"),  # noqa: SIM115
                              stderr=subprocess.STDOUT)
             for name, cmd in (("web", python_argv("web")),
                               ("worker", [*python_argv("worker", node="bench@%h"),
                                           "--loglevel", "WARNING"]),
                               ("dispatcher", python_argv("dispatcher")))]
    base = f"http://127.0.0.1:{web_port}"
    ids: list[str] = []
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            def ready() -> bool:
                try:
                    return http.get("/readyz").status_code == 200
                except httpx.HTTPError:
                    return False
            wait_until(ready, 60, "the web")
            warm = http.post("/submit?wait=30", json={"model": "synthetic", "webhook": hook,
                                                       "input": {"value": 0, "size": 1}})
            assert warm.status_code == 200, warm.text  # the worker is up
            wait_until(lambda: len(arrivals.at) >= 1, 30, "the warm-up's webhook")
            arrivals.at.clear()
            period_s = args.batch / args.rate
            t0 = time.monotonic()
            n_calls = int(args.seconds / period_s)
            for i in range(n_calls):
                delay = t0 + i * period_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the load's own schedule, not a wait for work
                resp = http.post("/submit/batch", json={
                    "model": "synthetic", "webhook": hook,
                    "inputs": [{"value": k, "size": 1} for k in range(args.batch)]})
                ids += [j["id"] for j in resp.json()["jobs"] if "id" in j]
            offered_s = time.monotonic() - t0
        want = {f"{i}.done" for i in ids}
        wait_until(lambda: want <= set(arrivals.at), 120, "every webhook")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        rx.shutdown()
    client = connect(redis_proc.url)
    keys = Keys(prefix)
    latencies = []
    for job_id in ids:
        rec = records.read(client, keys.job(job_id)) or {}
        latencies.append(arrivals.at[f"{job_id}.done"] - int(rec["t_done"]) / 1000)
    redis_proc.stop()
    ms = [x * 1000 for x in latencies]
    print(json.dumps({
        "jobs": len(ids), "offered_jobs_per_s": round(len(ids) / offered_s, 1),
        "delivered": len(ms), "p50_ms": round(statistics.median(ms), 1),
        "p90_ms": round(percentile(ms, 0.90), 1), "p99_ms": round(percentile(ms, 0.99), 1),
        "max_ms": round(max(ms), 1), "dispatcher_concurrency": args.concurrency,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
