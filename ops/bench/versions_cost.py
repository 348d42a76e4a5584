"""What version-aware admission costs: web and Redis CPU per job against a checkout
from before versions, in rotated rounds of fresh stacks on one private redis-server.

    PYTHONPATH=$PWD python ops/bench/versions_cost.py --before /path/to/old/checkout

Each round starts four stacks (one gunicorn, one Celery worker, the synthetic model
at a, b = 16, 2 ms: a full batch of 32 in 80 ms, so the worker is the limit and every
batch is full) in an order that rotates each round, and drives --jobs jobs through
each of --modes with --clients concurrent closed-loop clients:

    before   the processes import the --before checkout (PYTHONPATH): no versions
    plain    this checkout, a version 2 declared, no rollout: every job to version 1
    rollout  this checkout, ``PUT /models/synthetic/rollout`` 50 % to version 2
    pinned   this checkout, every job names ``synthetic@2``

Figures per job: web CPU (ms, gunicorn's process tree), Redis CPU (µs, ``INFO cpu``)
and Redis command time (µs, ``INFO commandstats``). The table gives each stack's
medians and, for each of this checkout's stacks, the median of the rounds' ratios
against ``before``. A rollout splits one stream of jobs over two versions' bins: with
too few clients its batches fill half as well, and Redis's work per job (per batch,
shared by fewer jobs) rises with it; keep --clients well above two batches.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory

import redis
from web_cpu import drive, redis_now, tree_cpu_s  # this folder
from web_instructions import VERSION_TABLE  # this folder

from carpool.bench.policies import Policy
from carpool.bench.stack import Stack, StackSpec
from carpool.stack.redis_local import start_redis

STACKS = ("before", "plain", "rollout", "pinned")
FIGURES = ("web_ms", "redis_cpu_us", "redis_cmd_us")
#: The worker is the limit (400 jobs/s), so every stack runs full batches.
COST_MS = (16.0, 2.0)


def start_rollout(base_url: str) -> None:
    body = json.dumps({"version": "2", "percent": 50}).encode()
    put = urllib.request.Request(base_url + "/models/synthetic/rollout", body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(put, timeout=10) as answer:
        if answer.status != 200:
            raise RuntimeError(f"rollout: HTTP {answer.status}")


def one_stack(name: str, redis_url: str, workdir: Path, args: argparse.Namespace,
              ) -> dict[str, dict[str, float]]:
    """A fresh stack of kind ``name``: per mode, FIGURES per job and jobs/s."""
    # Shedding off: the closed loop saturates the web, and a shed answer costs less than
    # a job, so every stack must end every job.
    spec = StackSpec(Policy(name, "versions", {"CARPOOL_WEB_MAX_QUEUE_MS": "0"}), redis_url,
                     cost_ms=COST_MS, root=args.before if name == "before" else None)
    stack = Stack(spec, workdir)
    if name != "before":
        config = Path(stack.env["CARPOOL_CONFIG"])
        config.write_text(config.read_text() + VERSION_TABLE)
        stack.env["CARPOOL_MODELS"] = "synthetic,synthetic@2"
    model = "synthetic@2" if name == "pinned" else "synthetic"
    r = redis.Redis.from_url(redis_url)
    figures: dict[str, dict[str, float]] = {}
    with stack:
        if name == "rollout":
            start_rollout(stack.base_url)
        web_pid = stack.procs[-1].pid  # the gunicorn master, started last
        for mode in args.modes:
            asyncio.run(drive(stack.base_url, mode, args.clients * 4, args.clients,
                              model=model))  # warm up (and every process sees the rollout)
            web0, (cpu0, cmd0), t0 = tree_cpu_s(web_pid), redis_now(r), time.monotonic()
            done = asyncio.run(drive(stack.base_url, mode, args.jobs, args.clients,
                                     model=model))
            web1, (cpu1, cmd1), t1 = tree_cpu_s(web_pid), redis_now(r), time.monotonic()
            if done != args.jobs:
                raise RuntimeError(f"{name} {mode}: {done} of {args.jobs} jobs done")
            figures[mode] = {"web_ms": (web1 - web0) / done * 1e3,
                             "redis_cpu_us": (cpu1 - cpu0) / done * 1e6,
                             "redis_cmd_us": (cmd1 - cmd0) / done * 1e6,
                             "jobs_per_s": done / (t1 - t0)}
    r.close()
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="a checkout before versions")
    p.add_argument("--jobs", type=int, default=3000, help="jobs per mode per stack")
    p.add_argument("--clients", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--modes", type=lambda s: s.split(","), default=["wait", "v2"])
    args = p.parse_args()
    runs: dict[str, list[dict[str, dict[str, float]]]] = {n: [] for n in STACKS}
    with TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp) / "redis")
        try:
            for k in range(args.rounds):
                for name in STACKS[k % 4:] + STACKS[:k % 4]:
                    runs[name].append(one_stack(name, server.url, Path(tmp), args))
                    print(f"round {k + 1} {name}: " + json.dumps(runs[name][-1]), flush=True)
        finally:
            server.stop()
    print(f"{args.jobs} jobs per mode per stack, {args.rounds} rounds, {args.clients} clients")
    print("| stack | mode | web CPU per job (ms) | Redis CPU per job (µs) "
          "| Redis commands per job (µs) | jobs/s |")
    print("|---|---|---|---|---|---|")
    for name in STACKS:
        for mode in args.modes:
            print(f"| {name} | {mode} | " + " | ".join(
                f"{statistics.median(x[mode][f] for x in runs[name]):.3f}"
                for f in (*FIGURES, "jobs_per_s")) + " |")
    for name in STACKS[1:]:
        for mode in args.modes:
            pairs = list(zip(runs[name], runs["before"], strict=True))
            print(f"| {name} / before | {mode} | " + " | ".join(
                f"{statistics.median(a[mode][f] / b[mode][f] for a, b in pairs):.3f}"
                for f in FIGURES) + " | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
