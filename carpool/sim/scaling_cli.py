"""``carpool bench simulate-scaling``: autoscaling policies on bursty and daily traces.

    carpool bench simulate-scaling --scenarios burst,burst-heavy,daily

runs carpool's need rule and the proxies other systems scale on (carpool/sim/scaling.py)
on each scenario, then writes ``results.jsonl``, ``summary.md`` and one PNG per
scenario (workers over time) to ``--out`` and prints the table.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from carpool.core.clihelp import HelpParser
from carpool.core.errors import MissingExtra
from carpool.core.extras import pyplot, require
from carpool.scheduling.batching import Cost
from carpool.sim.cli import _cost
from carpool.sim.scaling import (
    Outcome,
    ScalingConfig,
    burst_trace,
    compare,
    daily_trace,
    standard_policies,
)

#: A model whose jobs cost 20 times the synthetic one's (long texts on a small GPU).
HEAVY_B_MS = 100.0


@dataclass(frozen=True)
class Scenario:
    name: str
    config: ScalingConfig
    rate_per_s: Callable[[float], float]
    duration_s: float
    about: str


def scenarios(base: ScalingConfig) -> dict[str, Scenario]:
    heavy = replace(base, cost=Cost(base.cost.a_ms, HEAVY_B_MS))
    daily = replace(base, dt_s=1.0)
    cap, heavy_cap = base.per_worker_per_s(), heavy.per_worker_per_s()
    return {
        "burst": Scenario("burst", base, burst_trace(0.3 * cap), 1800.0,
                          "0.3 of a worker, 10x for 60 s at 300 s, decay over 180 s"),
        "burst-heavy": Scenario("burst-heavy", heavy, burst_trace(0.3 * heavy_cap), 1800.0,
                                f"the same, jobs of b = {HEAVY_B_MS:.0f} ms"),
        "from-zero": Scenario("from-zero", replace(base, start_workers=0),
                              burst_trace(0.0, burst_at_s=300.0, burst_s=300.0, decay_s=1.0,
                                          level_per_s=0.5 * cap), 1800.0,
                              "no worker; 0.5 of a worker for 300 s at 300 s, then nothing"),
        "daily": Scenario("daily", daily, daily_trace(0.2 * cap, 4 * cap), 86_400.0,
                          "24 h: 0.2 of a worker at 0 h to 4 workers at 12 h"),
    }


def build_parser() -> HelpParser:
    p = HelpParser(prog="carpool bench simulate-scaling", description=__doc__)
    p.add_argument("--scenarios", default="burst,burst-heavy,from-zero,daily",
                   help="burst, burst-heavy, from-zero, daily (comma list)")
    p.add_argument("--cost-ms", type=_cost, default=Cost(300.0, 5.0),
                   help="the model's t(n) = a + b·n, as 'a,b' ms (default 300,5)")
    p.add_argument("--max-batch", type=int, default=64, help="jobs per batch at most")
    p.add_argument("--deadline-ms", type=float, default=10_000.0, help="every job's deadline")
    p.add_argument("--cold-start-s", type=float, default=30.0, help="start to first batch")
    p.add_argument("--max-workers", type=int, default=8, help="maxReplicaCount")
    p.add_argument("--out", default="", help="output folder (default sim-out/scaling-<time>)")
    p.add_argument("--no-plots", action="store_true", help="write no PNGs")
    p.add_argument("--record", default="",
                   help="also write the need rule's carpool_workers_needed series, as two "
                        "web pods would export it, to this file (Prometheus text)")
    return p


def record(results: dict[str, list[Outcome]], path: Path, model: str = "synthetic") -> None:
    """The need rule's wishes as scraped samples: one scenario after another (an hour
    apart), each sample from two web pods, with Prometheus timestamps (ms)."""
    lines = [f"# carpool bench simulate-scaling --record: scenarios {', '.join(results)}",
             "# TYPE carpool_workers_needed gauge"]
    offset_s = 0.0
    for outcomes in results.values():
        rule = outcomes[0]  # standard_policies puts the need rule first
        for t, wish in rule.wishes:
            for pod in ("web-0", "web-1"):
                lines.append(f'carpool_workers_needed{{model="{model}",pod="{pod}"}} {wish} '
                             f"{round((offset_s + t) * 1000)}")
        offset_s += rule.wishes[-1][0] + 3600.0
    path.write_text("\n".join(lines) + "\n")


def markdown(results: dict[str, list[Outcome]], about: dict[str, str]) -> str:
    out = []
    for name, outcomes in results.items():
        offered = outcomes[0].offered
        out += [f"### {name}: {about[name]} ({offered:,.0f} jobs offered)", "",
                "| policy | deadline misses | refused | GPU-seconds | peak workers |",
                "|---|---|---|---|---|"]
        for o in outcomes:
            out.append(f"| {o.policy} | {o.misses:,.0f} | {o.refused:,.0f} "
                       f"({o.refused / max(offered, 1):.1%}) | {o.gpu_s:,.0f} "
                       f"| {o.peak_workers} |")
        out.append("")
    return "\n".join(out)


def plot(name: str, outcomes: Sequence[Outcome], out_dir: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    for o in outcomes:
        ax.step([t / 60 for t, *_ in o.series], [w for _, w, *_ in o.series], where="post",
                label=o.policy)
    ax.set_xlabel("minutes" if outcomes[0].series[-1][0] < 7200 else "minutes (24 h)")
    ax.set_ylabel("workers started")
    ax.set_title(f"carpool simulator: autoscaling, {name}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / f"scaling-{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.no_plots:
        try:
            require("matplotlib")
        except MissingExtra as exc:
            print(f"carpool bench simulate-scaling: {exc}", file=sys.stderr)
            return 2
    base = ScalingConfig(cost=args.cost_ms, max_batch=args.max_batch,
                         deadline_ms=args.deadline_ms, cold_start_s=args.cold_start_s,
                         max_workers=args.max_workers)
    known = scenarios(base)
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in known]
    if unknown:
        print(f"carpool bench simulate-scaling: unknown scenario {unknown[0]!r}; "
              f"choose from {', '.join(known)}", file=sys.stderr)
        return 2
    out = Path(args.out or f"sim-out/scaling-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, list[Outcome]] = {}
    for name in chosen:
        s = known[name]
        results[name] = compare(standard_policies(s.config), s.rate_per_s, s.duration_s,
                                s.config)
        print(f"  {name}: done", file=sys.stderr)
    with (out / "results.jsonl").open("w") as f:
        for name, outcomes in results.items():
            for o in outcomes:
                f.write(json.dumps({"scenario": name, **o.to_json()}) + "\n")
    table = markdown(results, {n: known[n].about for n in results})
    (out / "summary.md").write_text(table + "\n")
    if not args.no_plots:
        for name, outcomes in results.items():
            plot(name, outcomes, out)
    if args.record:
        record(results, Path(args.record))
    print(table)
    print(f"{len(results)} scenarios in {time.perf_counter() - started:.1f} s; wrote {out}/",
          file=sys.stderr)
    return 0
