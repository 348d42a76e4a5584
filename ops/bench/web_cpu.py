"""Web CPU per job: ``POST /submit?wait=S`` (one round trip) against submit + long-poll.

    python ops/bench/web_cpu.py --jobs 2000 --clients 64 --rounds 2
    python ops/bench/web_cpu.py --roots /path/to/old,. --rounds 3 --modes wait,poll,v2

Starts one real gunicorn (the shipped config) and one Celery worker (synthetic
model, cost a, b = 2, 0.05 ms, so the worker is never the limit) on a fresh key
prefix of the Redis at --redis-url, for each checkout of --roots in turn, each round
(PYTHONPATH: that checkout; ratios against the first). Each stack drives --jobs jobs
through each mode in turn, closed loop with --clients concurrent clients (saturating
the web tier), and reads the CPU time of gunicorn's process tree before and after:
CPU per job is that delta over the jobs (its system part, the kernel's, beside it).
Checkouts alternate within a round so that a busy machine weighs on both alike.

    poll   POST /submit, then GET /result/<id>?wait=30 (two requests per job)
    wait   POST /submit?wait=30 (one request; 200 with the result)
    submit POST /submit alone (no result fetched): the admission path's own cost
    v2     POST /v2/models/synthetic/infer, one row of 8 floats (the Open Inference
           Protocol, docs/v2.md; one request; 200 with the outputs)

``--profile N`` instead profiles N in-process submits (Flask's test client, real
Redis, no gunicorn) with cProfile and prints where the time goes.

``--tiers N``: API keys, tiers and quotas on against off, ``wait`` mode against a
worker at a, b = 16, 2 ms (the limit, 400 jobs/s: full batches), in N rounds of three
fresh stacks on one private redis-server (its ``INFO cpu`` gives Redis CPU
per job), in an order that rotates each round; the figures are the medians of each
round's ratios:

    off    no keys file: no fair share, no tiers, no quotas
    keys   two plain keys (each client one of them): fair share between them
    on     the same two keys, ``tier=priority`` and ``tier=flex``, each with quotas on
           device time and jobs/s too high to bind, so admit.lua checks both

Usage per key and hour is counted in every stack (without keys, under
``anonymous``): it has no switch, so none of the three leaves it out.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory

import psutil
import redis

from carpool.bench.httpclient import HttpClient
from carpool.bench.policies import Policy, policy
from carpool.bench.stack import Stack, StackSpec
from carpool.stack.redis_local import start_redis

MODES = ("poll", "wait", "submit", "v2")
#: The worker's synthetic cost: far below the web's, so the web tier saturates first.
COST_MS = (2.0, 0.05)
#: ?wait= of every long-poll and inline wait: a bound, never reached here.
WAIT_S = 30
#: --tiers: a slower model (a full batch of 32 in 80 ms, 400 jobs/s), so the worker is
#: the limit, every batch is full and Redis's work per job is alike in every stack.
TIERS_COST_MS = (16.0, 2.0)
#: --tiers: the two keys' options in the "on" stack. Quotas that never bind, still checked.
QUOTAS = "quota_device_s_per_hour=1000000 quota_jobs_per_s=1000000"
TIER_KEYS = {"off": (), "keys": ("", ""),
             "on": (f"tier=priority {QUOTAS}", f"tier=flex {QUOTAS}")}


def tree_cpu_s(pid: int) -> float:
    return sum(tree_user_system_s(pid))


def tree_user_system_s(pid: int) -> tuple[float, float]:
    """User and system CPU (s) of ``pid`` and its children so far."""
    root = psutil.Process(pid)
    user = system = 0.0
    for p in [root, *root.children(recursive=True)]:
        t = p.cpu_times()
        user, system = user + t.user, system + t.system
    return user, system


async def drive(base_url: str, mode: str, jobs: int, clients: int,
                keys: Sequence[str] = ("",), model: str = "synthetic") -> int:
    """Run ``jobs`` jobs through ``mode``; the number that ended done. Client k sends
    with API key ``keys[k % len(keys)]`` ("": none); ``model`` may name a version
    (``m@v``: ``/v2/models/m/versions/v/infer`` in mode v2)."""
    pools = [HttpClient(base_url, clients, {"Authorization": f"Bearer {k}"} if k else None)
             for k in keys]
    todo = iter(range(jobs))
    done = 0
    name, _, version = model.partition("@")
    v2_path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"

    async def client(http: HttpClient) -> None:
        nonlocal done
        for i in todo:
            if mode == "v2":  # the same size-8 job, as one row of a tensor
                row = [float(i)] + [0.0] * 7
                body = json.dumps({"inputs": [{"name": "VALUE", "datatype": "FP32",
                                               "shape": [1, 8], "data": row}]}).encode()
                answer = await http.request("POST", v2_path, body)
                done += answer.status == 200 and json.loads(answer.body)["outputs"][0][
                    "data"] == row
                continue
            body = json.dumps({"model": model, "input": {"value": i, "size": 8}}).encode()
            path = f"/submit?wait={WAIT_S}" if mode == "wait" else "/submit"
            answer = await http.request("POST", path, body)
            if mode == "poll" and answer.status == 202:
                job_id = json.loads(answer.body)["id"]
                answer = await http.request("GET", f"/result/{job_id}?wait={WAIT_S}")
            if mode == "submit" and answer.status == 202:
                done += 1
            elif answer.status == 200 and json.loads(answer.body)["status"] == "done":
                done += 1

    await asyncio.gather(*(client(pools[k % len(pools)]) for k in range(clients)))
    for http in pools:
        http.close()
    return done


def measure_root(args: argparse.Namespace, root: Path | None,
                 ) -> dict[str, tuple[float, float, int, float]]:
    """One fresh stack of ``root`` (None: this checkout): per mode, web CPU (s), wall
    (s), jobs done over --jobs jobs, and the system (kernel) part of that CPU (s)."""
    spec = StackSpec(policy("configured"), args.redis_url, cost_ms=COST_MS,
                     web_workers=args.web_workers, root=root)
    out = {}
    with TemporaryDirectory() as tmp, Stack(spec, Path(tmp)) as stack:
        web_pid = stack.procs[-1].pid  # the gunicorn master, started last
        asyncio.run(drive(stack.base_url, "wait", args.clients * 4, args.clients))  # warm up
        for mode in args.modes:
            (user0, sys0), t0 = tree_user_system_s(web_pid), time.monotonic()
            ok = asyncio.run(drive(stack.base_url, mode, args.jobs, args.clients))
            (user1, sys1), t1 = tree_user_system_s(web_pid), time.monotonic()
            out[mode] = (user1 - user0 + sys1 - sys0, t1 - t0, ok, sys1 - sys0)
    return out


def measure(args: argparse.Namespace) -> int:
    """Each round, one fresh stack per root in turn (before and after, in pairs)."""
    roots = [None if r == "." else Path(r).resolve() for r in args.roots.split(",")]
    rows: dict[tuple[int, str], list[tuple[float, float, int, float]]] = {
        (k, m): [] for k in range(len(roots)) for m in args.modes}
    for _ in range(args.rounds):
        for k, root in enumerate(roots):
            for mode, row in measure_root(args, root).items():
                rows[k, mode].append(row)
    print(f"{args.jobs} jobs x {args.rounds} rounds per mode, {args.clients} clients")
    print("| root | mode | requests/job | web CPU per job (ms), each round | of which system "
          "| jobs/s | done |")
    print("|---|---|---|---|---|---|---|")
    per_job: dict[tuple[int, str], list[float]] = {}
    for (k, mode), runs in rows.items():
        per_job[k, mode] = [r[0] / args.jobs * 1000 for r in runs]
        ok, wall = sum(r[2] for r in runs), sum(r[1] for r in runs)
        each = ", ".join(f"{ms:.3f}" for ms in per_job[k, mode])
        system = ", ".join(f"{r[3] / args.jobs * 1000:.3f}" for r in runs)
        print(f"| {args.roots.split(',')[k]} | {mode} | {2 if mode == 'poll' else 1} | "
              f"{each} | {system} | {ok / wall:,.0f} | {ok} |")
    for k in range(1, len(roots)):
        for mode in args.modes:
            ratios = [b / a for a, b in zip(per_job[0, mode], per_job[k, mode], strict=True)]
            print(f"{mode}: root {k} / root 0, each round: "
                  + ", ".join(f"{x:.3f}" for x in ratios))
    return 0


#: --tiers figures per job: web CPU (ms), Redis CPU (µs, INFO cpu), Redis command time
#: (µs, INFO commandstats: scripts and commands alone, less the event loop's syscalls).
FIGURES = ("web_ms", "redis_cpu_us", "redis_cmd_us")


def redis_now(r: redis.Redis) -> tuple[float, float]:
    """Redis's CPU (s) and its commands' time (s) so far."""
    cpu = r.info("cpu")
    usec = sum(int(v["usec"]) for v in r.info("commandstats").values())
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), usec / 1e6


def tiers_stack(name: str, redis_url: str, workdir: Path, args: argparse.Namespace,
                ) -> dict[str, float]:
    """One fresh stack of ``TIER_KEYS[name]``: FIGURES per job, and jobs/s."""
    options = TIER_KEYS[name]
    keys = [f"{name}-key-{k}-0123456789abcdef" for k in range(len(options))]
    # Shedding off: the closed loop saturates the web, and a shed answer costs less
    # than a job, so every stack must end every job.
    env = {"CARPOOL_WEB_MAX_QUEUE_MS": "0"}
    if keys:
        path = workdir / f"{name}.keys"
        path.write_text("".join(f"{k} {o}\n" for k, o in zip(keys, options, strict=True)))
        env["CARPOOL_API_KEYS_FILE"] = str(path)
    spec = StackSpec(Policy(name, "API keys, tiers and quotas", env), redis_url,
                     cost_ms=TIERS_COST_MS, web_workers=args.web_workers)
    r = redis.Redis.from_url(redis_url)
    with Stack(spec, workdir) as stack:
        web_pid = stack.procs[-1].pid
        asyncio.run(drive(stack.base_url, "wait", args.clients * 4, args.clients, keys or [""]))
        web0, (cpu0, cmd0), t0 = tree_cpu_s(web_pid), redis_now(r), time.monotonic()
        done = asyncio.run(drive(stack.base_url, "wait", args.jobs, args.clients, keys or [""]))
        web1, (cpu1, cmd1), t1 = tree_cpu_s(web_pid), redis_now(r), time.monotonic()
    r.close()
    if done != args.jobs:
        raise RuntimeError(f"{name}: {done} of {args.jobs} jobs done")
    return {"web_ms": (web1 - web0) / done * 1e3, "redis_cpu_us": (cpu1 - cpu0) / done * 1e6,
            "redis_cmd_us": (cmd1 - cmd0) / done * 1e6, "jobs_per_s": done / (t1 - t0)}


def tiers(args: argparse.Namespace) -> int:
    """``--tiers N``: off, keys and on, N rotated rounds; medians of the rounds' ratios."""
    names = list(TIER_KEYS)
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    with TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp) / "redis")
        try:
            for k in range(args.tiers):
                for name in names[k % 3:] + names[:k % 3]:
                    runs[name].append(tiers_stack(name, server.url, Path(tmp), args))
                    print(f"round {k + 1} {name}: " + ", ".join(
                        f"{f} {v:.3f}" for f, v in runs[name][-1].items()), flush=True)
        finally:
            server.stop()
    print(f"{args.jobs} jobs per stack, {args.tiers} rounds, {args.clients} clients, wait mode")
    print("| | web CPU per job (ms) | Redis CPU per job (µs) | Redis commands per job (µs) |")
    print("|---|---|---|---|")
    for name in names:
        print(f"| {name} | " + " | ".join(
            f"{statistics.median(x[f] for x in runs[name]):.3f}" for f in FIGURES) + " |")
    for base in ("off", "keys"):
        pairs = list(zip(runs["on"], runs[base], strict=True))
        print(f"| on / {base}, median of rounds | " + " | ".join(
            f"{statistics.median(a[f] / b[f] for a, b in pairs):.3f}" for f in FIGURES) + " |")
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
    p.add_argument("--roots", default=".",
                   help="comma-separated checkouts, measured in turn each round (before,after)")
    p.add_argument("--profile", type=int, default=0, help="profile this many submits instead")
    p.add_argument("--tiers", type=int, default=0,
                   help="rounds of keys, tiers and quotas off / keys / on instead")
    args = p.parse_args()
    if args.tiers:
        return tiers(args)
    return profile(args) if args.profile else measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
