"""Redis CPU of one admission (admit.lua), without API keys and with two tenants.

    python ops/bench/admit_cost.py --jobs 3000 --rounds 2

A private redis-server (so INFO commandstats counts only this run). Each round
makes a drain rate the way a worker does (claim, complete), so admission runs its
predicted-wait check and, with keys, fair queueing; then admits ``--jobs`` jobs
straight through ``Admissions.admit`` (no HTTP) and reads ``EVALSHA``'s µs per call.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import redis

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.jobs import Outcome, new_job_id
from carpool.stack.redis_local import start_redis

#: Never refused: the check runs, the job is admitted.
HUGE_DEPTH, LONG_WAIT_MS = 1_000_000, 600_000
TENANTS = {"no keys": [""], "2 keys": ["a" * 64, "b" * 64]}


def one_round(client: redis.Redis, spec: ModelSpec, owners: list[str], jobs: int) -> tuple[
        float, float]:
    """EVALSHA µs per call and commands run inside per admission."""
    q = Queue(client, Keys(f"cost{time.time_ns()}"))
    body = json.dumps({"value": 0, "size": 1})
    bin_spec = spec.bins[0]
    admissions = Admissions(client, q.keys)
    for _ in range(10):  # a drain rate, as a worker makes one
        single_admitted(admissions.admit(AdmitRequest(
            spec, (AdmitJob(bin_spec, new_job_id(spec.name), body),), queued_ttl_s=600)))
    claim = q.claim(spec, bin_spec.name, 10, lease_ms=5000, token="t", worker="w")
    q.complete(spec, claim, [Outcome(j.id, result=1) for j in claim.jobs], {"size": 10})
    client.config_resetstat()
    for i in range(jobs):
        single_admitted(admissions.admit(AdmitRequest(
            spec, (AdmitJob(bin_spec, new_job_id(spec.name), body),), queued_ttl_s=600,
            owner=owners[i % len(owners)])))
    stats = client.info("commandstats")
    inside = sum(v["calls"] for k, v in stats.items()
                 if k not in ("cmdstat_evalsha", "cmdstat_config", "cmdstat_info"))
    return float(stats["cmdstat_evalsha"]["usec_per_call"]), inside / jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    spec = load_catalogue(None).get("synthetic")
    spec = replace(spec, max_queue_ms=LONG_WAIT_MS,
                   bins=tuple(replace(b, max_depth=HUGE_DEPTH, max_batch=2) for b in spec.bins))
    tmp = Path(tempfile.mkdtemp(prefix="carpool-admit-cost-"))
    server = start_redis(tmp / "redis")
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for r in range(args.rounds):
            for label, owners in TENANTS.items():
                us, inside = one_round(client, spec, owners, args.jobs)
                print(f"round {r + 1} {label:8s} admit.lua {us:6.2f} µs/call, "
                      f"{inside:.1f} commands inside")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
