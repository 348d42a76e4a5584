"""Redis CPU per job, end to end: admit + claim + complete + one result fetch.

    python ops/bench/redis_cost.py --jobs 3000 --out before.json
    python ops/bench/redis_cost.py --jobs 3000 --compare before.json

Starts a private redis-server (so ``INFO`` counts only this run), carpool's real
web under gunicorn and one real Celery worker serving ``synthetic``. Client
threads submit synthetic jobs over HTTP, 64 at a time (``--mode batch``: one
``POST /submit/batch`` of 64; ``--mode single``: 64 threads, one ``POST /submit``
each), and fetch each result once by long-poll (``GET /result/<id>?wait=30``), the
results of one submission in parallel, as an asynchronous client would.

Redis's own CPU per job is ``used_cpu_user + used_cpu_sys`` from ``INFO cpu``
before and after the run, divided by the jobs; ``INFO commandstats`` gives each
command's calls and time (a script's time includes the commands it runs).
Everything Redis does in that window counts: Celery's own traffic, lease
renewals, peeks, the long-poll notifications.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
import requests

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.catalogue import builtin_models
from carpool.core.jobs import Outcome, new_job_id
from carpool.stack.localstack import web_command, worker_command
from carpool.stack.redis_local import free_port, start_redis

#: The checkout this script belongs to (a before/after comparison runs two).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Jobs per HTTP submission ("64 at a time").
CHUNK = 64
#: Jobs per claim and completion when the scripts run alone (the synthetic model's
#: max_batch), and per round trip of result reads.
BATCH = 32
#: Longest long-poll; a result not final by then counts as a failure of the run.
POLL_WAIT_S = 30
#: Bound on starting the stack; a run that needs longer is broken, not slow.
START_TIMEOUT_S = 120.0


def redis_cpu_s(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def io_events(r: redis.Redis) -> tuple[int, int]:
    """Read and write events Redis processed: about one each per client round trip."""
    st = r.info("stats")
    return int(st["total_reads_processed"]), int(st["total_writes_processed"])


def commandstats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec)."""
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for k, v in r.info("commandstats").items()}


def per_job(after: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]],
            jobs: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls > c0:
            out[name] = {"calls": round((calls - c0) / jobs, 3),
                         "usec": round((usec - u0) / jobs, 3)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["usec"]))


def _wait_ok(url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)  # waiting for a process we started to listen: no event to block on
    raise TimeoutError(f"{url} did not answer")


class Client:
    """Submits and fetches; counts results that were not ``done``."""

    def __init__(self, base: str, fetchers: ThreadPoolExecutor) -> None:
        self.base = base
        self.fetchers = fetchers
        self.local = threading.local()
        self.bad: list[str] = []
        self.counter = itertools.count()

    def _session(self) -> requests.Session:
        sess = getattr(self.local, "s", None)
        if sess is None:
            sess = self.local.s = requests.Session()
        return sess

    def _body(self) -> dict[str, Any]:
        return {"value": next(self.counter), "size": 8}

    def fetch(self, job_id: str) -> None:
        url = f"{self.base}/result/{job_id}?wait={POLL_WAIT_S}"
        try:
            r = self._session().get(url, timeout=60)
        except requests.ConnectionError:
            # A fetch thread's kept-alive connection may idle past gunicorn's keepalive
            # (2 s) and be closed just as it is reused; a read is safe to send again.
            r = self._session().get(url, timeout=60)
        if r.status_code != 200 or r.json()["status"] != "done":
            self.bad.append(f"{job_id}: {r.status_code} {r.text[:120]}")

    def batch_round(self, _: int) -> int:
        inputs = [self._body() for _ in range(CHUNK)]
        r = self._session().post(f"{self.base}/submit/batch",
                                 json={"model": "synthetic", "inputs": inputs}, timeout=60)
        ids = [j["id"] for j in r.json()["jobs"] if "id" in j]
        list(self.fetchers.map(self.fetch, ids))  # as an async client would: all at once
        return len(ids)

    def single_job(self, _: int) -> int:
        r = self._session().post(f"{self.base}/submit",
                                 json={"model": "synthetic", "input": self._body()}, timeout=60)
        if r.status_code != 202:
            self.bad.append(f"submit: {r.status_code} {r.text[:120]}")
            return 0
        self.fetch(r.json()["id"])
        return 1


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="carpool-redis-cost-"))
    server = start_redis(tmp / "redis")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, CARPOOL_REDIS_URL=server.url, CARPOOL_WEB_BIND=f"127.0.0.1:{port}",
               CARPOOL_SYNTHETIC_COST_MS=args.cost_ms, CARPOOL_MODELS="synthetic",
               CARPOOL_WORKER_METRICS_PORT="0")
    procs = []
    with open(tmp / "procs.log", "ab") as logs:
        try:
            for cmd in (web_command(), worker_command(0)):
                # From this checkout's root: `python -m` puts the working directory
                # first on sys.path, so the web and worker run this checkout's code.
                procs.append(subprocess.Popen(cmd, env=env, stdout=logs, cwd=REPO_ROOT,
                                              stderr=subprocess.STDOUT))
            _wait_ok(f"{base}/healthz")
            fetchers = ThreadPoolExecutor(CHUNK * args.clients)
            client = Client(base, fetchers)
            client.batch_round(0)  # warm-up: web processes, scripts loaded, worker serving
            client.bad.clear()
            version = str(r.info("server")["redis_version"])
            cpu0, cmd0, io0 = redis_cpu_s(r), commandstats(r), io_events(r)
            t0 = time.perf_counter()
            if args.mode == "batch":
                rounds = -(-args.jobs // CHUNK)
                with ThreadPoolExecutor(args.clients) as pool:
                    jobs = sum(pool.map(client.batch_round, range(rounds)))
            else:
                with ThreadPoolExecutor(CHUNK) as pool:
                    jobs = sum(pool.map(client.single_job, range(args.jobs)))
            wall_s = time.perf_counter() - t0
            cpu_s, cmds = redis_cpu_s(r) - cpu0, per_job(commandstats(r), cmd0, jobs)
            io = [(b - a) / jobs for a, b in zip(io0, io_events(r), strict=True)]
            fetchers.shutdown()
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)
            scripts_us = script_costs(server.url, args.jobs)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=60)
            server.stop()
    if client.bad:
        raise RuntimeError(f"{len(client.bad)} results not done, e.g. {client.bad[:3]}")
    scripts = {k: v for k, v in cmds.items() if k.startswith("eval")}
    return {
        "redis": version, "mode": args.mode, "jobs": jobs, "wall_s": round(wall_s, 2),
        "jobs_per_s": round(jobs / wall_s, 1),
        "redis_cpu_us_per_job": round(1e6 * cpu_s / jobs, 1),
        "command_us_per_job": round(sum(v["usec"] for v in cmds.values()), 1),
        "script_calls_per_job": round(sum(v["calls"] for v in scripts.values()), 3),
        "reads_per_job": round(io[0], 3), "writes_per_job": round(io[1], 3),
        "commands": cmds, "scripts": scripts_us,
    }


def script_phases(queue: Queue, jobs: int) -> list[tuple[str, Callable[[], None]]]:
    """A job's life in four phases, each over ``jobs`` jobs straight from Python, to be
    run in order: admission 64 jobs a call where the queue can (else one), claims and
    completions 32 a batch, result reads 32 a round trip where it can (else one).
    ``script_costs`` times them here; ``redis_instructions.py`` counts them."""
    spec = builtin_models()["synthetic"]
    small = spec.bins[0]
    body = json.dumps({"value": 1, "size": 8})
    claims: list[Any] = []

    def admit() -> None:
        admissions = Admissions(queue.client, queue.keys)
        for _ in range(0, jobs, CHUNK):
            admissions.admit(AdmitRequest(spec, tuple(
                AdmitJob(small, new_job_id(spec.name), body) for _ in range(CHUNK)), 3600))

    def claim() -> None:
        for k in range(jobs // BATCH):
            claims.append(queue.claim(spec, small.name, BATCH, lease_ms=600_000,
                                      token=f"t{k}", worker="w"))

    def complete() -> None:
        for c in claims:
            outs = [Outcome(j.id, result={"echo": 1, "checksum": "ab12"}) for j in c.jobs]
            queue.complete(spec, c, outs, {"size": len(c.jobs), "bin": small.name,
                                           "worker": "w"})

    def fetch() -> None:
        ids = [j.id for c in claims for j in c.jobs]
        many = getattr(queue, "get_many", None)
        for k in range(0, len(ids), BATCH):
            if many is not None:
                many(ids[k:k + BATCH])
            else:
                for job_id in ids[k:k + BATCH]:
                    queue.get(job_id)

    return [("admit.lua", admit), ("claim.lua", claim), ("complete.lua", complete),
            ("result read", fetch)]


def script_costs(url: str, jobs: int) -> dict[str, float]:
    """Each script alone, straight from Python on the same Redis (the stack stopped):
    µs of Redis time per job from ``commandstats`` (a script's time includes its
    commands), phase by phase (``script_phases``)."""
    r = connect(url)
    out = {}
    for name, step in script_phases(Queue(r, Keys("scripts")), jobs):
        r.config_resetstat()
        step()
        out[name] = round(sum(int(v["usec"]) for k, v in r.info("commandstats").items()
                              if k in ("cmdstat_evalsha", "cmdstat_hgetall",
                                       "cmdstat_hmget", "cmdstat_mget")) / jobs, 2)
    r.close()
    return out


def _job_id(model: str) -> str:
    try:
        return new_job_id(model)
    except TypeError:  # the queue before per-model shards: ids carry no shard
        return new_job_id()  # type: ignore[call-arg]


def table(after: dict[str, Any], before: dict[str, Any] | None) -> str:
    """Markdown: per command, calls and µs per job (before → after when given)."""
    head = f"Redis CPU per job: {after['redis_cpu_us_per_job']} µs"
    if before:
        head = (f"Redis CPU per job: {before['redis_cpu_us_per_job']} → "
                f"{after['redis_cpu_us_per_job']} µs "
                f"({after['redis_cpu_us_per_job'] / before['redis_cpu_us_per_job']:.2f}×)")
    lines = [head, "", "| command | calls/job | µs/job |", "|---|---|---|"]
    names = list(after["commands"])
    if before:
        names += [n for n in before["commands"] if n not in after["commands"]]
    zero = {"calls": 0, "usec": 0}
    for name in names:
        a = after["commands"].get(name, zero)
        if before:
            b = before["commands"].get(name, zero)
            lines.append(f"| {name} | {b['calls']} → {a['calls']} | {b['usec']} → {a['usec']} |")
        else:
            lines.append(f"| {name} | {a['calls']} | {a['usec']} |")
    lines += ["", "| script (alone) | µs/job |", "|---|---|"]
    for name, us in after.get("scripts", {}).items():
        was = (before or {}).get("scripts", {}).get(name)
        lines.append(f"| {name} | {f'{was} → ' if was is not None else ''}{us} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--mode", choices=("batch", "single"), default="batch")
    ap.add_argument("--clients", type=int, default=2, help="submitting threads in batch mode")
    ap.add_argument("--cost-ms", default="2,0.05", help="synthetic a,b: a + b·n ms per batch")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument("--compare", type=Path, help="a JSON of an earlier run: before → after")
    args = ap.parse_args()
    result = run(args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    before = json.loads(args.compare.read_text()) if args.compare else None
    print(json.dumps({k: v for k, v in result.items() if k != "commands"}))
    print(table(result, before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
