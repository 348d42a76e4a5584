"""Service tiers in a surge: a priority key and a flex key on one model past its rate.

    python ops/bench/tiers.py --duration 30 --out tiers.json

Starts a stack of its own (gunicorn, one Celery worker serving ``synthetic``, a
keys file: a ``tier=priority`` key, a ``tier=flex`` key, an ``admin`` key; with
``--tiers off`` the same keys in the default tier) on a private redis-server, or
``--redis-url``. Or drives ``--url`` with ``--keys PRIORITY,FLEX,ADMIN``.

1. **The ceiling**: the priority key queues ``--drain-s`` × ``--model-rate`` jobs in
   one ``POST /submit/batch`` and long-polls each; the model's served rate is those
   jobs over the time until the last ended. The load is set from it (it also primes
   the drain rate admission predicts waits from, as a model in service has one).
2. **The surge**: for ``--duration`` s, open-loop Poisson arrivals per key,
   ``--priority-x`` and ``--flex-x`` × the served rate. Each caller sends one
   ``POST /submit?wait=W`` with ``X-Carpool-Timeout: W`` (``--wait-s``, 10): its jobs'
   deadline is the time it waits, and one round trip costs the web least. Per key:
   offered, admitted (an id came back), refused (by error code), done (within W of
   its scheduled arrival), late (admitted and not done within W: still queued or
   running at W, expired, or answered past W).
3. **Usage**: once every admitted job ended, ``GET /usage`` (admin key; after less
   before) against the sum of the job documents' ``usage`` per key: jobs, device ms,
   queue ms; and the refusals it counted against the 429s seen.

Prints a table and one JSON line; exit 0 whatever the figures (the reader judges them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from carpool.backend.usage import key_label
from carpool.bench.arrivals import poisson_times
from carpool.bench.httpclient import ConnectionClosed, HttpClient
from carpool.bench.policies import Policy
from carpool.bench.stack import Stack, StackSpec
from carpool.bench.workload import SYNTHETIC, make_input, new_nonce
from carpool.core.settings import api_key_digest
from carpool.stack.redis_local import start_redis

#: Every job is this size: the synthetic model's small bin (max_batch 32).
SIZE = 8
MAX_BATCH = 32
#: The synthetic cost per batch (ms); the per-job cost is set from --model-rate.
A_MS = 4.0
#: A caller's socket waits this long past its ?wait= for the answer (the web answers at W).
ANSWER_GRACE_S = 5.0
#: Bound on a job ending once the surge is over (its deadline is W).
SETTLE_S = 60.0
#: ?wait= of the long-polls that read jobs' final documents.
POLL_S = 20
FINAL = ("done", "failed", "expired", "cancelled")
TIERS = ("priority", "flex")


@dataclass
class Tally:
    """One key's surge."""

    rate_per_s: float
    offered: int = 0
    admitted: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # by error code
    refused_429: int = 0  # those admit.lua refused: usage counts them
    done: int = 0
    late: int = 0
    errors: int = 0
    e2e_ms: list[float] = field(default_factory=list)  # of those done in time
    start_late_ms: list[float] = field(default_factory=list)

    @property
    def missed(self) -> int:
        """Refused, late or failed: what the caller did not get in time."""
        return self.offered - self.done

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("e2e_ms", "start_late_ms")}
        out["missed_pct"] = round(100 * self.missed / max(1, self.offered), 2)
        out["p99_ms"] = round(_p99(self.e2e_ms), 1)
        out["start_late_p99_ms"] = round(_p99(self.start_late_ms), 1)
        return out


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))] if values else 0.0


@dataclass
class Keys:
    priority: str
    flex: str
    admin: str

    def of(self, tier: str) -> str:
        return str(getattr(self, tier))


class Surge:
    """Drives the run over ``base_url``; collects every admitted job's final document."""

    def __init__(self, base_url: str, keys: Keys, wait_s: float) -> None:
        self.base_url, self.keys, self.wait_s = base_url, keys, wait_s
        self.nonce = new_nonce()
        self.docs: dict[str, list[dict[str, Any]]] = {t: [] for t in TIERS}
        self.pending: dict[str, list[str]] = {t: [] for t in TIERS}

    def client(self, key: str, **headers: str) -> HttpClient:
        return HttpClient(self.base_url, 4096, {"Authorization": f"Bearer {key}", **headers})

    async def final(self, http: HttpClient, job_id: str) -> dict[str, Any]:
        """The job's final document, long-polled (bounded by SETTLE_S)."""
        end = time.monotonic() + SETTLE_S
        while time.monotonic() < end:
            answer = await http.request("GET", f"/result/{job_id}?wait={POLL_S}")
            doc: dict[str, Any] = json.loads(answer.body)
            if answer.status == 200 and doc.get("status") in FINAL:
                return doc
        raise TimeoutError(f"job {job_id} did not end within {SETTLE_S} s")

    async def ceiling(self, jobs: int) -> float:
        """The served rate (jobs/s) of a backlog of ``jobs`` queued at once."""
        http = self.client(self.keys.priority)
        inputs = [make_input(self.nonce, -1 - i, SIZE) for i in range(jobs)]
        t0 = time.monotonic()
        answer = await http.request("POST", "/submit/batch", json.dumps(
            {"model": SYNTHETIC, "inputs": inputs}).encode())
        ids = [j["id"] for j in json.loads(answer.body)["jobs"] if "id" in j]
        if len(ids) != jobs:
            raise RuntimeError(f"the drain's batch admitted {len(ids)} of {jobs}: "
                               f"{answer.body[:300]!r}")
        docs = await asyncio.gather(*(self.final(http, i) for i in ids))
        elapsed = time.monotonic() - t0
        http.close()
        self.docs["priority"] += docs
        return jobs / elapsed

    async def caller(self, http: HttpClient, tier: str, seq: int, t_sched: float,
                     t0: float, tally: Tally) -> None:
        loop = asyncio.get_running_loop()
        tally.start_late_ms.append((loop.time() - t0 - t_sched) * 1000)
        body = json.dumps({"model": SYNTHETIC, "input": make_input(self.nonce, seq, SIZE)})
        try:
            async with asyncio.timeout(self.wait_s + ANSWER_GRACE_S):
                answer = await http.request("POST", f"/submit?wait={self.wait_s:g}",
                                            body.encode())
        except (OSError, ConnectionClosed, TimeoutError):
            tally.errors += 1  # no answer: admitted or not, unknown
            return
        e2e_ms = (loop.time() - t0 - t_sched) * 1000
        doc: dict[str, Any] = json.loads(answer.body) if answer.body else {}
        if answer.status in (200, 202):
            tally.admitted += 1
            if answer.status == 202:  # still queued or running at W
                tally.late += 1
                self.pending[tier].append(str(doc["id"]))
                return
            self.docs[tier].append(doc)
            if doc.get("status") == "done" and e2e_ms <= self.wait_s * 1000:
                tally.done += 1
                tally.e2e_ms.append(e2e_ms)
            else:
                tally.late += 1
        elif answer.status in (429, 503):
            code = str((doc.get("error") or {}).get("code", answer.status))
            tally.refused[code] = tally.refused.get(code, 0) + 1
            tally.refused_429 += answer.status == 429
        else:
            tally.errors += 1

    async def surge(self, rates: dict[str, float], duration_s: float, seed: int,
                    ) -> dict[str, Tally]:
        loop = asyncio.get_running_loop()
        tallies = {t: Tally(round(rates[t], 1)) for t in TIERS}
        clients = {t: self.client(self.keys.of(t), **{"X-Carpool-Timeout": f"{self.wait_s:g}"})
                   for t in TIERS}
        arrivals = sorted((t_s, tier) for k, tier in enumerate(TIERS)
                          for t_s in poisson_times(rates[tier], duration_s, seed + k))
        tasks = []
        t0 = loop.time()
        for seq, (t_s, tier) in enumerate(arrivals):
            delay = t_s - (loop.time() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tallies[tier].offered += 1
            tasks.append(asyncio.create_task(
                self.caller(clients[tier], tier, seq, t_s, t0, tallies[tier])))
        await asyncio.gather(*tasks)
        for tier in TIERS:  # the late ones end too: their usage counts
            self.docs[tier] += await asyncio.gather(
                *(self.final(clients[tier], i) for i in self.pending[tier]))
            clients[tier].close()
        return tallies

    async def usage(self) -> dict[str, dict[str, float]]:
        """GET /usage (every key's, all hours kept), by tier."""
        http = self.client(self.keys.admin)
        answer = await http.request("GET", "/usage")
        http.close()
        rows = {r["key"]: r for r in json.loads(answer.body)["usage"] if r["model"] == SYNTHETIC}
        zero = {"jobs": 0, "device_ms": 0.0, "queue_ms": 0, "refused": 0}
        return {t: {k: rows.get(key_label(api_key_digest(self.keys.of(t))), zero)[k]
                    for k in zero} for t in TIERS}

    def docs_usage(self, tier: str) -> dict[str, float]:
        used = [d["usage"] for d in self.docs[tier] if d.get("usage")]
        return {"jobs": len(used), "device_ms": sum(u["device_ms"] for u in used),
                "queue_ms": sum(u["queue_ms"] for u in used)}


async def measure(base_url: str, keys: Keys, args: argparse.Namespace) -> dict[str, Any]:
    s = Surge(base_url, keys, args.wait_s)
    before = await s.usage()
    served = await s.ceiling(round(args.drain_s * args.model_rate))
    rates = {"priority": args.priority_x * served, "flex": args.flex_x * served}
    tallies = await s.surge(rates, args.duration, args.seed)
    after = await s.usage()
    usage = {}
    for tier in TIERS:
        seen = {k: after[tier][k] - before[tier][k] for k in after[tier]}
        docs = s.docs_usage(tier)
        usage[tier] = {"usage": seen, "docs": docs,
                       "device_ratio": round(seen["device_ms"] / max(1e-9, docs["device_ms"]), 4),
                       "queue_ratio": round(seen["queue_ms"] / max(1e-9, docs["queue_ms"]), 4)}
    return {"served_per_s": round(served, 1), "duration_s": args.duration,
            "wait_s": args.wait_s, "tiers": args.tiers,
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "keys": {t: tallies[t].summary() for t in TIERS}, "usage": usage}


def cost_ms(model_rate: float) -> tuple[float, float]:
    """The synthetic a, b whose full batch serves ``model_rate`` jobs/s."""
    return A_MS, round(1000 / model_rate - A_MS / MAX_BATCH, 4)


@contextmanager
def private_stack(args: argparse.Namespace, keys: Keys) -> Iterator[str]:
    """A stack of its own: a keys file with the tiers (or, ``--tiers off``, without)."""
    with tempfile.TemporaryDirectory(prefix="carpool-tiers-") as tmp:
        opts = {"priority": " tier=priority", "flex": " tier=flex"}
        if args.tiers == "off":
            opts = {"priority": "", "flex": ""}
        path = Path(tmp) / "keys"
        path.write_text(f"{keys.priority}{opts['priority']}\n{keys.flex}{opts['flex']}\n"
                        f"{keys.admin} admin\n")
        server = None if args.redis_url else start_redis(Path(tmp) / "redis")
        url = args.redis_url or (server.url if server else "")
        spec = StackSpec(Policy("tiers", "a priority, a flex and an admin key",
                                env={"CARPOOL_API_KEYS_FILE": str(path)}),
                         url, cost_ms=cost_ms(args.model_rate))
        try:
            with Stack(spec, Path(tmp) / "stack") as stack:
                yield stack.base_url
        finally:
            if server:
                server.stop()


def table(result: dict[str, Any]) -> str:
    lines = [f"served {result['served_per_s']} jobs/s (the drain); tiers {result['tiers']}; "
             f"{result['duration_s']} s; callers wait {result['wait_s']} s; "
             f"load {result['load_avg_1m']}",
             "| key | offered/s | offered | refused | late | errors | done | missed | p99 ms |"
             " usage device / docs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for tier in TIERS:
        k, u = result["keys"][tier], result["usage"][tier]
        refused = ", ".join(f"{c} {n}" for c, n in sorted(k["refused"].items())) or "0"
        lines.append(f"| {tier} | {k['rate_per_s']} | {k['offered']} | {refused} | {k['late']} "
                     f"| {k['errors']} | {k['done']} | {k['missed_pct']} % | {k['p99_ms']} "
                     f"| {u['device_ratio']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=30.0, help="the surge, seconds")
    p.add_argument("--model-rate", type=float, default=120.0,
                   help="jobs/s the synthetic model is set to serve (full batches)")
    p.add_argument("--priority-x", type=float, default=0.5, help="× the served rate")
    p.add_argument("--flex-x", type=float, default=1.5, help="× the served rate")
    p.add_argument("--wait-s", type=float, default=10.0, help="how long each caller waits")
    p.add_argument("--drain-s", type=float, default=4.0, help="the ceiling's backlog, seconds")
    p.add_argument("--tiers", choices=("on", "off"), default="on")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--redis-url", default="", help="default: a private redis-server")
    p.add_argument("--url", default="", help="a running stack instead of one of its own")
    p.add_argument("--keys", default="", help="with --url: PRIORITY,FLEX,ADMIN")
    p.add_argument("--out", type=Path, help="write the JSON here too")
    args = p.parse_args()
    if args.url:
        parts = args.keys.split(",")
        if len(parts) != 3:
            p.error("--url needs --keys PRIORITY,FLEX,ADMIN")
        keys = Keys(*parts)
        result = asyncio.run(measure(args.url, keys, args))
    else:
        keys = Keys(*(secrets.token_hex(16) for _ in range(3)))
        with private_stack(args, keys) as base_url:
            result = asyncio.run(measure(base_url, keys, args))
    print(table(result))
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
