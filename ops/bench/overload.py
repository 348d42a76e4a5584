"""Overload on a model with many bins: goodput, timeouts and refusals, old code against new.

    python ops/bench/overload.py --roots /path/to/old,. --factors 1.5,3 --out overload.json

When the web is the bottleneck (docs/operations.md, shedding):

    python ops/bench/overload.py --sizes 16 --cost-ms 20,1 --deadlines 0 \
        --factors 1,2,5 --protocols poll,wait --ceiling

For each checkout in ``--roots`` (each runs its own web and worker: ``python -m`` from
that root imports that root's code), each offered load in ``--factors`` (× the model's
offline rate) and each deadline setting in ``--deadlines`` (0: none), this starts a
private redis-server, the web under gunicorn and one Celery worker serving the synthetic
model, then drives it open-loop: Poisson arrivals with a mix of sizes (so the model's
bins compete for one worker), each job submitted then long-polled, its client giving up
``--client-timeout-s`` after its arrival. The same arrivals go to every run. Each caller
may hold its own connection (``--connections``, 4096 by default): a small pool would
queue the excess in the generator, where the web cannot see it, instead of in the web;
``--fresh-connections`` opens one per request instead, closed after it, as a client
without a session does. ``--protocols``: ``poll`` submits then long-polls, ``wait``
sends one ``POST /submit?wait``. ``--ceiling`` first measures the generator's own
ceiling against a stub server (carpool.bench.ceiling), so the reader knows the load
was offered; ``--web-cpus`` gives the web CPUs of its own, the rest the others; each
run reports the 1-minute load average (the machine may be shared), the web's sheds by
reason and the p99 of the refusals' answer times twice: as the client saw them (from
sending: the generator's own lateness and a connection's retried SYNs are in it) and
at the web (``carpool_web_refusal_seconds``, from the request's bytes reaching the
host: the accept queue is in it), the latter as the bucket bound holding it and as
Prometheus's interpolated estimate.

The synthetic model sleeps a + b·n ms per batch of n whatever the bin, so its
offline rate is exact: per bin ``max_batch / (a + b·max_batch)`` jobs/s, and for a
mix the jobs-weighted harmonic mean of those (each job costs its bin's share of a
full batch). Goodput is the jobs answered ``done`` within the client's timeout per
second, from the first arrival to the last such answer (under overload the worker is
busy throughout), over that rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import redis
import requests

from carpool.backend.keys import Keys
from carpool.bench.arrivals import Arrival, poisson_times
from carpool.bench.ceiling import measure_ceiling
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.records import JobRecord, Outcome
from carpool.bench.scrape import (
    SCRAPE_TIMEOUT_S,
    parse_histogram,
    quantile_bound,
    quantile_estimate,
)
from carpool.bench.workload import SizeMix, new_nonce
from carpool.core.catalogue import builtin_models
from carpool.core.settings import load_settings
from carpool.stack.localstack import web_command, worker_command
from carpool.stack.redis_local import free_port, start_redis

#: Bound on starting a stack; a start that needs longer is broken, not slow.
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RunResult:
    root: str
    protocol: str
    factor: float
    deadline_ms: int
    offered: int
    done_in_time: int
    timed_out: int
    refused_429: int
    refused_503: int
    errors: int
    goodput_per_s: float
    offline_per_s: float
    #: p99 of the refusals' (429 and 503) answer times, from sending, in ms.
    refusal_p99_ms: float = 0.0
    #: carpool_web_shed_total by reason, scraped at the end of the run.
    sheds: dict[str, float] | None = None
    #: p99 of the refusals' waits at the web (carpool_web_refusal_seconds), in ms: the
    #: bucket bound holding it, and the estimate interpolated within that bucket.
    #: None: no refusals.
    web_refusal_p99_le_ms: float | None = None
    web_refusal_p99_ms: float | None = None
    load_avg_1m: float = 0.0
    #: p99 of how late the generator started jobs after their scheduled arrival, in ms:
    #: large when the generator itself runs short of CPU (the load was not all offered).
    start_late_p99_ms: float = 0.0

    @property
    def goodput_ratio(self) -> float:
        return self.goodput_per_s / self.offline_per_s


def offline_rate_per_s(mix: SizeMix, cost_ms: tuple[float, float]) -> float:
    """The synthetic model's offline rate on ``mix``: full batches of each job's bin."""
    spec = builtin_models()["synthetic"]
    a_ms, b_ms = cost_ms
    total = sum(mix.weights)
    ms_per_job = 0.0
    for size, weight in zip(mix.sizes, mix.weights, strict=True):
        n = spec.bin_for(size).max_batch
        ms_per_job += weight / total * (a_ms + b_ms * n) / n
    return 1000.0 / ms_per_job


def _wait_ok(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)  # a process just started tells nobody when it listens
    raise TimeoutError(f"{url} did not answer")


def _worker_serving(redis_url: str) -> bool:
    """Whether a worker has registered what it serves (its models are loaded)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return bool(client.hlen(Keys(load_settings({}).key_prefix).workers))
    finally:
        client.close()


def _web_refusal_p99_ms(text: str) -> tuple[float | None, float | None]:
    """(bucket bound, interpolated estimate) of the refusals' p99 wait at the web, in
    ms; None, None when there were none."""
    buckets = parse_histogram(text, "carpool_web_refusal_seconds")
    bound_s, count = quantile_bound({}, buckets, 0.99)
    if count == 0:
        return None, None
    return round(1000 * bound_s, 1), round(1000 * quantile_estimate({}, buckets, 0.99), 1)


def _sheds(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("carpool_web_shed_total{"):
            labels, _, value = line.partition("} ")
            out[labels.split('reason="', 1)[1].split('"', 1)[0]] = float(value)
    return out


@contextmanager
def local_stack(root: Path, tmp: Path, env: dict[str, str], web_cpus: frozenset[int] = frozenset(),
                ) -> Iterator[tuple[str, str, list[subprocess.Popen[bytes]]]]:
    """A private redis-server, the web and one worker importing ``root``'s code, with
    ``env`` over this process's environment: yields the Redis URL, the web's base URL and
    the processes (web, worker) once the worker serves; all stopped on exit. The web
    runs on ``web_cpus`` when given (the others inherit this process's CPUs)."""
    server = start_redis(tmp / "redis")
    port = free_port()
    env = dict(os.environ, CARPOOL_REDIS_URL=server.url, CARPOOL_WEB_BIND=f"127.0.0.1:{port}",
               CARPOOL_WORKER_METRICS_PORT="0", PYTHONPATH=str(root), **env)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(tmp / "procs.log", "ab") as logs:
            for cmd, cpus in ((web_command(), web_cpus), (worker_command(0), frozenset())):
                pin = (lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None
                procs.append(subprocess.Popen(cmd, env=env, stdout=logs, cwd=root,
                                              stderr=subprocess.STDOUT, preexec_fn=pin))
        base_url = f"http://127.0.0.1:{port}"
        _wait_ok(f"{base_url}/healthz", procs[0])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _worker_serving(server.url):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no worker registered; see {tmp / 'procs.log'}")
            time.sleep(0.2)  # the worker loads and registers: no event to block on here
        yield server.url, base_url, procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        server.stop()


def run_one(root: Path, arrivals: Sequence[Arrival], args: argparse.Namespace,
            factor: float, deadline_ms: int, offline_per_s: float,
            protocol: str = "poll") -> RunResult:
    tmp = Path(tempfile.mkdtemp(prefix="carpool-overload-"))
    a_ms, b_ms = args.cost_ms
    env = {"CARPOOL_SYNTHETIC_COST_MS": f"{a_ms:g},{b_ms:g}", "CARPOOL_MODELS": "synthetic"}
    if args.web_workers:
        env["CARPOOL_WEB_WORKERS"] = str(args.web_workers)
    with local_stack(root, tmp, env, args.web_cpus) as (_, base_url, _procs):
        opts = HttpOptions(base_url=base_url,
                           client_timeout_s=args.client_timeout_s,
                           grace_s=args.client_timeout_s + 5, protocol=protocol,
                           submit_connections=args.connections,
                           poll_connections=args.connections,
                           keep_alive=not args.fresh_connections)
        records = run_http(arrivals, opts, new_nonce())
        load_1m = os.getloadavg()[0]
        scraped = requests.get(f"{base_url}/metrics", timeout=SCRAPE_TIMEOUT_S).text
    result = summarise(str(root), factor, deadline_ms, records, args, offline_per_s, protocol)
    at_web_le_ms, at_web_ms = _web_refusal_p99_ms(scraped)
    return RunResult(**{**asdict(result), "sheds": _sheds(scraped),
                        "web_refusal_p99_le_ms": at_web_le_ms,
                        "web_refusal_p99_ms": at_web_ms, "load_avg_1m": round(load_1m, 2)})


def _p99_ms(values_s: Sequence[float]) -> float:
    if not values_s:
        return 0.0
    ordered = sorted(values_s)
    return round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)


def summarise(root: str, factor: float, deadline_ms: int, records: Sequence[JobRecord],
              args: argparse.Namespace, offline_per_s: float,
              protocol: str = "poll") -> RunResult:
    in_time = [r for r in records if r.outcome is Outcome.OK]
    # Over the span the worker had work: from the first arrival to the last answer in
    # time (under overload it is busy throughout), not over the arrivals alone.
    span_s = max((r.t_final or 0.0 for r in in_time), default=0.0) - min(
        (r.t_sched for r in records), default=0.0)
    refused = [r for r in records if r.http_status in (429, 503) and r.t_final is not None]
    return RunResult(
        root=root, protocol=protocol, factor=factor, deadline_ms=deadline_ms,
        offered=len(records),
        done_in_time=len(in_time),
        timed_out=sum(r.outcome is Outcome.TIMEOUT for r in records),
        refused_429=sum(r.outcome is Outcome.REJECTED for r in records),
        refused_503=sum(r.outcome is Outcome.ERROR and r.http_status == 503 for r in records),
        errors=sum(r.outcome is Outcome.ERROR and r.http_status != 503 for r in records),
        goodput_per_s=round(len(in_time) / span_s, 1) if span_s > 0 else 0.0,
        offline_per_s=round(offline_per_s, 1),
        refusal_p99_ms=_p99_ms([(r.t_final or 0.0) - r.t_start for r in refused]),
        start_late_p99_ms=_p99_ms([r.t_start - r.t_sched for r in records]))


def _raise_open_files(wanted: int) -> None:
    """Room for every caller's connection: the soft limit is often 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--roots", default=".", help="comma-separated checkouts to compare")
    ap.add_argument("--factors", default="1.5,3", help="offered load, × the offline rate")
    ap.add_argument("--deadlines", default="0,10000", help="deadline_ms per job (0: none)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    ap.add_argument("--sizes", default="16:0.6,200:0.3,800:0.1",
                    help="size mix: the synthetic model's bins small/medium/large")
    ap.add_argument("--cost-ms", type=lambda s: tuple(float(x) for x in s.split(",")),
                    default=(100.0, 10.0), help="synthetic a,b: a + b·n ms per batch")
    ap.add_argument("--client-timeout-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--protocols", default="poll", help="comma-separated: poll, wait")
    ap.add_argument("--connections", type=int, default=4096,
                    help="the generator's connections for submits (and as many for polls)")
    ap.add_argument("--fresh-connections", action="store_true",
                    help="each request on a new connection, closed after (no keep-alive)")
    ap.add_argument("--web-workers", type=int, default=0,
                    help="CARPOOL_WEB_WORKERS (0: the web's default)")
    ap.add_argument("--web-cpus", type=lambda s: frozenset(int(c) for c in s.split(",")),
                    default=frozenset(), help="CPUs for the web alone (e.g. 0); the "
                    "generator, worker and Redis get the others")
    ap.add_argument("--ceiling", action="store_true",
                    help="first measure the generator's own ceiling (jobs/s, stub server)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    mix = SizeMix.parse(args.sizes)
    offline = offline_rate_per_s(mix, args.cost_ms)
    _raise_open_files(4 * args.connections)
    if args.web_cpus:  # inherited by Redis and the worker, started from here
        os.sched_setaffinity(0, os.sched_getaffinity(0) - args.web_cpus)
    if args.ceiling:
        ceiling = measure_ceiling()
        print(json.dumps({"generator_ceiling_per_s": ceiling.rate,
                          "steps": [[p.label, round(p.delivered, 3), round(p.lateness_p99_ms, 1)]
                                    for p in ceiling.points],
                          "load_avg_1m": round(os.getloadavg()[0], 2)}), flush=True)
    results: list[RunResult] = []
    for factor in (float(f) for f in args.factors.split(",")):
        rng = random.Random(args.seed)
        times = poisson_times(factor * offline, args.duration, args.seed)
        sizes = [mix.draw(rng) for _ in times]
        for deadline_ms in (int(d) for d in args.deadlines.split(",")):
            arrivals = [Arrival(t, size, deadline_ms=deadline_ms)
                        for t, size in zip(times, sizes, strict=True)]
            for root in (Path(r).resolve() for r in args.roots.split(",")):
                for protocol in args.protocols.split(","):
                    result = run_one(root, arrivals, args, factor, deadline_ms, offline,
                                     protocol)
                    results.append(result)
                    print(json.dumps({**asdict(result),
                                      "goodput_ratio": round(result.goodput_ratio, 3),
                                      "timed_out_share": round(
                                          result.timed_out / max(1, result.offered), 4)}),
                          flush=True)
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
