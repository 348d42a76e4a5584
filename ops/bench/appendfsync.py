"""What `appendfsync always` costs an admission, against `everysec` and no AOF.

    python ops/bench/appendfsync.py --jobs 3000 --clients 8

For each mode it starts a private redis-server on this machine's disk, then
admits synthetic jobs of ~1 KiB through the real admit.lua (carpool.backend.admissions):
first from one client, one at a time (latency per admission), then from
``--clients`` threads at once (throughput: Redis groups the writes of one event
loop turn into one fsync, so concurrency hides part of the cost).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import new_job_id
from carpool.stack.redis_local import answers, free_port, redis_server_binary
from carpool.stack.waiting import wait_until

MODES: dict[str, tuple[str, ...]] = {
    "no AOF": ("--appendonly", "no"),
    "AOF everysec": ("--appendonly", "yes", "--appendfsync", "everysec"),
    "AOF always": ("--appendonly", "yes", "--appendfsync", "always"),
}
#: Bound on a redis-server's start.
START_TIMEOUT_S = 20.0


@contextmanager
def redis_server(args: Sequence[str]) -> Iterator[str]:
    """A redis-server with ``args`` in a fresh directory; yields its URL."""
    data = Path(tempfile.mkdtemp(prefix="carpool-fsync-"))
    port = free_port()
    proc = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(data), "--save", "", *args],
                            stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: answers(url), START_TIMEOUT_S, "redis-server to answer")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(data, ignore_errors=True)


def admit_many(queue: Queue, n: int, value: str) -> list[float]:
    """Admit n jobs one at a time; each admission's latency in microseconds."""
    spec = load_catalogue(None).get("synthetic")
    bin_spec = spec.bins[0]
    body = json.dumps({"value": value, "size": 1})
    admissions = Admissions(queue.client, queue.keys)
    latencies = []
    for _ in range(n):
        t0 = time.perf_counter()
        single_admitted(admissions.admit(AdmitRequest(
            spec, (AdmitJob(bin_spec, new_job_id(spec.name), body),), queued_ttl_s=600)))
        latencies.append((time.perf_counter() - t0) * 1e6)
    return latencies


def measure(url: str, jobs: int, clients: int) -> dict[str, float]:
    value = "x" * 1000
    # Each client admits under its own key prefix, so no bin reaches its bound (5000).
    prefix = f"bench-{new_job_id('bench')[4:12]}"
    solo = Queue(connect(url), Keys(prefix + "-solo"))
    lat = admit_many(solo, jobs, value)
    per_thread = jobs // clients
    threads = []
    t0 = time.perf_counter()
    for c in range(clients):
        q = Queue(connect(url), Keys(f"{prefix}-c{c}"))
        threads.append(threading.Thread(target=admit_many, args=(q, per_thread, value)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    info = solo.client.info("persistence")
    return {
        "one_client_mean_us": round(statistics.fmean(lat), 1),
        "one_client_p50_us": round(statistics.median(lat), 1),
        "one_client_p99_us": round(statistics.quantiles(lat, n=100)[98], 1),
        f"{clients}_clients_admits_per_s": round(per_thread * clients / wall),
        "aof_delayed_fsync": float(info.get("aof_delayed_fsync", 0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="admissions per measurement")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    if args.jobs > 5000:
        parser.error("--jobs is at most 5000 (the synthetic bin's bound)")
    results = {}
    for mode, redis_args in MODES.items():
        with redis_server(redis_args) as url:
            results[mode] = measure(url, args.jobs, args.clients)
        print(f"{mode:14} {json.dumps(results[mode])}", flush=True)
    print(json.dumps({"jobs": args.jobs, "clients": args.clients, "results": results}))


if __name__ == "__main__":
    main()
