"""`carpool up --workers 1..3` under a surge: issue #36's scenario, end to end on one host.

    python ops/bench/autoscale.py --roots /path/to/old,. --workers 1..3,1 --out autoscale.json

For each checkout in ``--roots`` (``python -m carpool.cli`` from that root runs that
root's code) and each pool in ``--workers``: a private redis-server and
`carpool up --workers 1..3` serving the synthetic model at
a, b = 300, 5 ms (one worker, full batches of 32: ~69.6 jobs/s). Poisson arrivals of
size-1 jobs at ``--factor`` (2.6) × that rate for ``--duration-s`` (60 s), each with a
10 s deadline and a caller that gives up at 10 s. Reported: the pool over time (from
``scaling.log``), the callers admitted after ``--settle-s`` (20 s) and the share of them
answered late (the issue's bar: ≤ 1 %), refusals, the seconds from the last arrival to
a pool of one (bar: ≤ 150 s), and admitted jobs never finished (bar: none: every
admitted job ends done or, past its deadline, expired).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import requests

from carpool.bench.arrivals import Arrival, poisson_times
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.records import JobRecord, Outcome
from carpool.bench.workload import new_nonce
from carpool.stack.redis_local import free_port, start_redis
from carpool.stack.waiting import wait_until

A_MS, B_MS, MAX_BATCH = 300.0, 5.0, 32  # the synthetic model's small bin
POOL = re.compile(r"scale   (\d+) -> (\d+) workers")


def one_worker_per_s() -> float:
    return MAX_BATCH / ((A_MS + B_MS * MAX_BATCH) / 1000)


def pool_changes(log: Path, t0_wall: float) -> list[tuple[float, int]]:
    """(seconds after the first arrival, pool size) at each change in scaling.log."""
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        m = POOL.search(line)
        if m:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%dT%H:%M:%S"))
            out.append((round(stamp - t0_wall, 1), int(m.group(2))))
    return out


def summarise(records: Sequence[JobRecord], settle_s: float, statuses: dict[str, int],
              changes: list[tuple[float, int]], end_s: float) -> dict[str, object]:
    admitted = [r for r in records if r.job_id]
    later = [r for r in admitted if r.t_sched >= settle_s]
    late = [r for r in later if r.outcome is not Outcome.OK]
    back_to_one = next((t for t, n in changes if n == 1 and t > end_s), None)
    return {
        "offered": len(records), "admitted": len(admitted),
        "refused": sum(r.outcome in (Outcome.REJECTED, Outcome.ERROR) and not r.job_id
                       for r in records),
        "admitted_after_settle": len(later), "late_after_settle": len(late),
        "late_share_after_settle": round(len(late) / max(1, len(later)), 4),
        "late_in_first_settle": sum(r.outcome is not Outcome.OK for r in admitted
                                    if r.t_sched < settle_s),
        "refused_in_first_settle": sum(not r.job_id for r in records if r.t_sched < settle_s),
        "max_pool": max((n for _, n in changes), default=1),
        "pool_changes_s": changes,
        "s_from_last_arrival_to_one": None if back_to_one is None
        else round(back_to_one - end_s, 1),
        "final_statuses": statuses,
        "lost": sum(n for s, n in statuses.items() if s not in ("done", "expired")),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--roots", default=".", help="comma-separated checkouts to compare")
    ap.add_argument("--factor", type=float, default=2.6, help="× one worker's rate")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--deadline-ms", type=int, default=10_000)
    ap.add_argument("--settle-s", type=float, default=20.0)
    ap.add_argument("--shrink-bound-s", type=float, default=150.0)
    ap.add_argument("--workers", default="1..3", help="comma-separated pools (N or MIN..MAX)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    results = [run_one(Path(root).resolve(), workers, args)
               for root in args.roots.split(",") for workers in args.workers.split(",")]
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


def run_one(root: Path, workers: str, args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="carpool-autoscale-"))
    server = start_redis(tmp / "redis")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CARPOOL_MODELS": "synthetic", "CARPOOL_WORKER_METRICS_PORT": "0",
           "CARPOOL_SYNTHETIC_COST_MS": f"{A_MS:g},{B_MS:g}", "PYTHONPATH": str(root)}
    out = tmp / "up.out"
    with open(out, "wb") as f:
        up = subprocess.Popen([sys.executable, "-m", "carpool.cli", "up", "--workers",
                               workers, "--no-flower", "--port", str(port),
                               "--redis-url", server.url, "--state-dir", str(tmp / "state")],
                              env=env, cwd=root, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: up.poll() is not None or "carpool is up" in out.read_text(), 180,
                   "carpool up", poll_s=0.2)
        if up.poll() is not None:
            raise SystemExit(out.read_text())
        rate = args.factor * one_worker_per_s()
        arrivals = [Arrival(t, 1, deadline_ms=args.deadline_ms)
                    for t in poisson_times(rate, args.duration_s, args.seed)]
        opts = HttpOptions(base_url=base, client_timeout_s=args.deadline_ms / 1000,
                           grace_s=args.deadline_ms / 1000 + 5)
        t0_wall = time.time()
        records = run_http(arrivals, opts, new_nonce())
        end_s = arrivals[-1].t_s if arrivals else 0.0
        log = tmp / "state" / "scaling.log"

        def back_to_one() -> bool:
            changes = pool_changes(log, t0_wall)
            return not changes or (changes[-1][1] == 1 and changes[-1][0] > end_s)

        try:  # a wait for the pool's own decision: there is no event to block on
            wait_until(back_to_one, end_s + args.shrink_bound_s + 30 - (time.time() - t0_wall),
                       "the pool back to one", poll_s=1.0)
        except TimeoutError as exc:
            print(exc, file=sys.stderr)
        statuses: dict[str, int] = {}
        for r in records:
            if r.job_id:
                status = requests.get(f"{base}/result/{r.job_id}", timeout=10).json()["status"]
                statuses[status] = statuses.get(status, 0) + 1
        result = {"root": str(root), "factor": args.factor, "rate_per_s": round(rate, 1),
                  "duration_s": args.duration_s, "deadline_ms": args.deadline_ms,
                  "workers": workers,
                  **summarise(records, args.settle_s, statuses,
                              pool_changes(log, t0_wall), end_s)}
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        server.stop()
    print(json.dumps(result), flush=True)
    print(f"logs: {tmp}", file=sys.stderr)
    return result


if __name__ == "__main__":
    sys.exit(main())
