"""A sweep: every policy on the same schedule, at each offered load and pattern."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from carpool.bench.arrivals import Arrival, Bursts, arrivals
from carpool.bench.workload import SizeMix
from carpool.core.catalogue import ModelSpec
from carpool.scheduling.batching import Cost
from carpool.sim.engine import SimConfig, simulate
from carpool.sim.policies import Policy, capacity_per_s
from carpool.sim.summary import Summary, summarize


@dataclass(frozen=True)
class Row:
    pattern: str
    load: float
    rate_per_s: float
    policy: str
    summary: Summary

    def to_json(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "load": self.load, "rate_per_s": round(self.rate_per_s, 2),
                "policy": self.policy, **self.summary.to_json()}


def bin_shares(spec: ModelSpec, sizes: SizeMix) -> dict[str, float]:
    total = sum(sizes.weights)
    shares: dict[str, float] = {}
    for size, weight in zip(sizes.sizes, sizes.weights, strict=True):
        name = spec.bin_for(size).name
        shares[name] = shares.get(name, 0.0) + weight / total
    return shares


def sweep(spec: ModelSpec, base: SimConfig, policies: Sequence[Policy], loads: Sequence[float],
          patterns: Sequence[str], sizes: SizeMix, duration_s: float,
          progress: Callable[[Row], None] = lambda row: None,
          trace: list[Arrival] | None = None, bursts: Bursts | None = None) -> list[Row]:
    """One row per pattern × load × policy; a trace replaces the patterns and loads."""
    capacity = capacity_per_s(spec, base.cost, bin_shares(spec, sizes), base.workers)
    rows = []
    cases: list[tuple[str, float, list[Arrival]]] = []
    if trace is not None:
        span = max(trace[-1].t_s, 1e-9) if trace else 1.0
        cases.append(("trace", len(trace) / span / capacity, trace))
    else:
        for pattern in patterns:
            for load in loads:
                cases.append((pattern, load, arrivals(pattern, load * capacity, duration_s,
                                                      sizes, base.seed, bursts=bursts)))
    for pattern, load, schedule in cases:
        for policy in policies:
            config = replace(base, spec=policy.apply(spec), adaptive=policy.adaptive)
            row = Row(pattern, load, load * capacity, policy.name,
                      summarize(simulate(config, schedule)))
            progress(row)
            rows.append(row)
    return rows


def verdicts(rows: Sequence[Row], adaptive: str, fixed: Sequence[str], default: str,
             tolerance: float = 0.05) -> list[str]:
    """The goals, checked per pattern and load: adaptive within ``tolerance`` of the
    best fixed window's p99 and throughput, and (in bursts) better than the default."""
    out = []
    for pattern in sorted({r.pattern for r in rows}):
        for load in sorted({r.load for r in rows if r.pattern == pattern}):
            here = {r.policy: r.summary for r in rows if r.pattern == pattern and r.load == load}
            a = here[adaptive]
            best_p99 = min(here[f].p99_ms for f in fixed)
            best_tp = max(here[f].throughput_per_s for f in fixed)
            ok_p99 = a.p99_ms <= best_p99 * (1 + tolerance)
            ok_tp = a.throughput_per_s >= best_tp * (1 - tolerance)
            line = (f"{pattern} {load:.0%}: p99 {a.p99_ms:.1f} vs best fixed {best_p99:.1f} "
                    f"({'ok' if ok_p99 else 'MISSED'}), throughput {a.throughput_per_s:.0f} vs "
                    f"{best_tp:.0f} ({'ok' if ok_tp else 'MISSED'})")
            if pattern == "bursts":
                d = here[default].p99_ms
                word = "beats" if a.p99_ms < d else "ties" if a.p99_ms <= d * 1.01 else "LOSES"
                line += f", vs {default} p99 {d:.1f} ({word})"
            out.append(line)
    return out


def baseline_cost(spec: ModelSpec, cost: Cost) -> str:
    return ", ".join(f"{b.name}: t({b.max_batch}) = {cost.ms(b.max_batch):.0f} ms"
                     for b in spec.bins)
