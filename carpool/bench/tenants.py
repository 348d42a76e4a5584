"""``carpool bench tenants``: two API keys share one bin; one floods it, one stays quiet.

The stack runs with two API keys. The quiet tenant sends ``--quiet`` × the
stack's analytical limit, first alone (its unloaded latency), then while the
flooding tenant sends ``--flood`` × the limit on the same bin. Fair share
(docs/admission.md) should refuse the flood near the bin's bound, keep admitting
the quiet tenant and sort its jobs ahead of the flood's backlog: the report
compares the quiet tenant's p99 and 429s in both runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from carpool.bench.arrivals import Arrival
from carpool.bench.client import HttpDriver, HttpOptions
from carpool.bench.records import JobRecord
from carpool.bench.report import finish_report
from carpool.bench.stats import Summary, summarize
from carpool.bench.sweep import StepResult, poisson_step
from carpool.bench.target import Target, each_target
from carpool.bench.workload import SizeMix, new_nonce


def drive_tenants(target: Target, tenants: Sequence[tuple[str, list[Arrival]]],
                  grace_s: float, client_timeout_s: float) -> list[list[JobRecord]]:
    """Each tenant's arrivals at once, each with its key; one record list per tenant."""

    async def main() -> list[list[JobRecord]]:
        drivers = [HttpDriver(HttpOptions(target.base_url, grace_s=grace_s, api_key=key,
                                          client_timeout_s=client_timeout_s),
                              new_nonce(), lambda: None) for key, _ in tenants]
        return list(await asyncio.gather(*(d.run(arrivals) for d, (_, arrivals)
                                           in zip(drivers, tenants, strict=True))))

    return asyncio.run(main())


def cmd_tenants(args: argparse.Namespace, out: Path, header: str) -> int:
    sizes = SizeMix.parse(args.sizes)
    quiet_key, flood_key = secrets.token_hex(16), secrets.token_hex(16)
    before = os.environ.get("CARPOOL_API_KEYS")
    os.environ["CARPOOL_API_KEYS"] = f"{quiet_key},{flood_key}"  # the stacks' environment
    results: list[StepResult] = []
    notes: list[str] = []
    try:
        for _, target in each_target(args, out, "http"):
            limit = target.limit_per_s or 0.0
            if not limit:
                raise ValueError("carpool bench tenants needs a stack of its own (no --url)")
            quiet = poisson_step("quiet", args.quiet * limit, args.duration, sizes, args.seed)
            flood = poisson_step("flood", args.flood * limit, args.duration, sizes,
                                 args.seed + 1)
            timeout_s = args.client_timeout_s
            drive_tenants(target, [(quiet_key, quiet.arrivals[:20])], args.grace_s, timeout_s)
            (alone,) = drive_tenants(target, [(quiet_key, quiet.arrivals)], args.grace_s,
                                     timeout_s)
            quiet_both, flood_both = drive_tenants(
                target, [(quiet_key, quiet.arrivals), (flood_key, flood.arrivals)],
                args.grace_s, timeout_s)
            runs = [(f"{target.label} quiet alone", alone, quiet),
                    (f"{target.label} quiet + flood", quiet_both, quiet),
                    (f"{target.label} flood", flood_both, flood)]
            mine = [StepResult(summarize(label, recs, step.duration_s), recs)
                    for label, recs, step in runs]
            results += mine
            notes.append(_verdict(target.label, mine[0].summary, mine[1].summary))
    finally:
        if before is None:
            os.environ.pop("CARPOOL_API_KEYS", None)
        else:
            os.environ["CARPOOL_API_KEYS"] = before
    return finish_report(out, results, header, notes)


def _verdict(label: str, alone: Summary, shared: Summary) -> str:
    ratio = shared.e2e_ms.p99 / alone.e2e_ms.p99 if alone.e2e_ms.p99 else float("nan")
    return (f"{label}: the quiet tenant's p99 {shared.e2e_ms.p99:,.0f} ms beside the flood, "
            f"{alone.e2e_ms.p99:,.0f} ms alone ({ratio:.1f}×); its 429s beside the flood: "
            f"{shared.counts['rejected']} of {shared.jobs}")
