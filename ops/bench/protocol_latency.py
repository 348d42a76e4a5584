"""Open-loop latency of the one-round-trip protocols on one stack, interleaved.

    python ops/bench/protocol_latency.py --rate 150 --jobs 900 --rounds 2

One real gunicorn and one Celery worker (synthetic, 2 + 0.1 ms a batch); the same
Poisson arrivals driven through ``POST /submit?wait`` and ``POST /v2/.../infer``
in turn (carpool.bench.client), on the same stack, so that a busy machine weighs
on both alike; then p50 and p90 of each run, from each job's scheduled arrival.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from tempfile import TemporaryDirectory

from carpool.bench.arrivals import Arrival
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.policies import policy
from carpool.bench.stack import Stack, StackSpec

#: The worker's synthetic cost: far below its limit at the rates this is run at.
COST_MS = (2.0, 0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=150.0, help="jobs/s")
    p.add_argument("--jobs", type=int, default=900, help="jobs per run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()
    rng = random.Random(1)
    t_s, arrivals = 0.0, []
    for _ in range(args.jobs):
        t_s += rng.expovariate(args.rate)
        arrivals.append(Arrival(t_s=t_s, size=args.size))
    spec = StackSpec(policy("configured"), args.redis_url, cost_ms=COST_MS)
    print("| round | protocol | p50 ms | p90 ms | ok |")
    print("|---|---|---|---|---|")
    with TemporaryDirectory() as tmp, Stack(spec, Path(tmp)) as stack:
        for r in range(args.rounds):
            for protocol in ("wait", "v2"):
                records = run_http(arrivals, HttpOptions(stack.base_url, protocol=protocol),
                                   f"r{r}{protocol}{rng.random()}")
                lat = sorted((x.t_final - x.t_sched) * 1000 for x in records
                             if x.t_final is not None)
                ok = sum(x.outcome.value == "ok" for x in records)
                print(f"| {r + 1} | {protocol} | {lat[len(lat) // 2]:.1f} | "
                      f"{lat[len(lat) * 9 // 10]:.1f} | {ok}/{len(records)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
