"""The subcommands of ``carpool bench``: build the steps, run them per target, report."""

from __future__ import annotations

import argparse
import datetime
import math
import shlex
from collections.abc import Sequence
from pathlib import Path

from carpool.bench import plots, remote
from carpool.bench.arrivals import Bursts, all_at_once, load_trace
from carpool.bench.ceiling import measure_ceiling
from carpool.bench.report import finish_report, machine
from carpool.bench.stats import KneeRule, Summary, find_knee
from carpool.bench.sweep import (
    Step,
    StepResult,
    fraction_steps,
    poisson_step,
    progress_bar,
    run_steps,
)
from carpool.bench.target import each_target
from carpool.bench.tenants import cmd_tenants
from carpool.bench.workload import SizeMix, new_nonce
from carpool.core.extras import require_bench


def dispatch(args: argparse.Namespace, argv: Sequence[str]) -> int:
    require_bench()  # the progress bar and the plots: say so now, not after the run
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"bench-out/{args.command}-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    header = "\n".join([
        f"# carpool bench {args.command}", "",
        f"- date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"- machine: {machine()}",
        f"- command: `carpool bench {shlex.join(argv)}`",
    ])
    if args.command == "ceiling":
        return cmd_ceiling(args, out, header)
    if args.url:  # its workers and costs are the target's own, not --workers/--cost-ms
        header += remote.describe(args.url, args.sizes)
    else:
        header += (f"\n- synthetic cost a, b = {args.cost_ms[0]:g}, {args.cost_ms[1]:g} ms; "
                   f"sizes {args.sizes}; workers {args.workers}")
    handler = {"run": cmd_run, "sweep": cmd_sweep, "drain": cmd_drain,
               "tenants": cmd_tenants}[args.command]
    return handler(args, out, header)


def _baseline_notes(rates: dict[str, float], limits: dict[str, float | None],
                    what: str) -> list[str]:
    """Each target's rate as a fraction of its limit, against the per-job baseline with
    as many workers, and (for N workers) against the same policy with one."""
    notes = []
    for label, rate in rates.items():
        name, _, workers = label.partition(" x")
        suffix = f" x{workers}" if workers else ""
        parts = [f"{label}: {what} {rate:,.0f} jobs/s"]
        limit = limits.get(label)
        if limit:
            parts.append(f"{rate / limit:.1%} of its analytical limit {limit:,.0f}/s")
        base = rates.get(f"per-job{suffix}")
        if base and name != "per-job":
            parts.append(f"{rate / base:.1f}× per-job{suffix}")
        one = rates.get(f"{name} x1")
        if one and workers not in ("", "1"):
            parts.append(f"{rate / one:.2f}× {name} x1")
        notes.append(", ".join(parts))
    return notes


def cmd_run(args: argparse.Namespace, out: Path, header: str) -> int:
    sizes = SizeMix.parse(args.sizes)
    if args.arrivals == "trace":
        arrivals = load_trace(Path(args.trace), sizes, args.seed)
        step = Step("trace", arrivals, max(a.t_s for a in arrivals) if arrivals else None)
    else:
        bursts = (Bursts(args.burst_factor, args.burst_s, args.period_s)
                  if args.arrivals == "bursts" else None)
        step = poisson_step(f"{args.rate:g}/s", args.rate, args.duration, sizes, args.seed, bursts)
    policies = [p for p in args.policies.split(",") if p.strip()]
    bar = progress_bar(len(step.arrivals) * len(policies) * len(args.workers))
    results: list[StepResult] = []
    for _, target in each_target(args, out, args.transport):
        results += run_steps(target, [step], new_nonce(), args.grace_s, bar)
    bar.close()
    for r in results:
        name = str(r.summary.extra["target"]).replace(" ", "-")
        plots.latency_over_time(r.records, out / f"latency-over-time-{name}.png",
                                r.summary.label)
    plots.batch_histogram([r.summary for r in results], out / "batch-sizes.png")
    rates = {str(r.summary.extra["target"]): r.summary.achieved_rate for r in results}
    limits = {str(r.summary.extra["target"]): _limit(r.summary) for r in results}
    return finish_report(out, results, header, _baseline_notes(rates, limits, "achieved"))


def _limit(s: Summary) -> float | None:
    value = s.extra.get("limit_per_s")
    return value if isinstance(value, float) else None


def cmd_sweep(args: argparse.Namespace, out: Path, header: str) -> int:
    sizes = SizeMix.parse(args.sizes)
    rule = KneeRule(k=args.knee_k, min_delivered=args.knee_delivered)
    results: list[StepResult] = []
    notes = [f"knee rule: the highest offered rate, scanning upward, before the first one "
             f"whose p99 exceeds {rule.k:g}× the lowest rate's p99 or whose achieved rate "
             f"falls below {rule.min_delivered:.0%} of offered"]
    capacities: dict[str, float] = {}
    limits: dict[str, float | None] = {}
    knees: dict[str, Summary | None] = {}
    for _, target in each_target(args, out, args.transport):
        capacity = target.limit_per_s if args.capacity == "limit" else float(args.capacity)
        if not capacity:
            raise ValueError("--capacity limit needs a stack of our own; give jobs/s instead")
        steps = fraction_steps(capacity, args.fractions, args.duration, sizes, args.seed)
        bar = progress_bar(sum(len(s.arrivals) for s in steps))
        mine = run_steps(target, steps, new_nonce(), args.grace_s, bar)
        bar.close()
        results += mine
        knee = find_knee([r.summary for r in mine], rule)
        knees[target.label] = knee
        capacities[target.label] = max(r.summary.achieved_rate for r in mine)
        limits[target.label] = target.limit_per_s
        notes.append(f"{target.label}: fractions of {capacity:,.0f} jobs/s; knee "
                     + (f"at offered {knee.offered_rate:,.0f}/s, achieved "
                        f"{knee.achieved_rate:,.0f}/s, p99 {knee.e2e_ms.p99:,.1f} ms"
                        if knee and knee.offered_rate else "not found (lowest rate unhealthy)"))
    summaries = [r.summary for r in results]
    plots.latency_vs_throughput(summaries, knees, out / "latency-vs-throughput.png")
    plots.overload(summaries, out / "overload.png")
    # Batch sizes at each curve's knee (at its lowest rate where no knee was found).
    shown = [knees.get(t) or min((s for s in summaries if s.extra["target"] == t),
                                 key=lambda s: s.offered_rate or 0.0) for t in knees]
    plots.batch_histogram(shown, out / "batch-sizes.png")
    notes += _baseline_notes(capacities, limits, "highest achieved")
    return finish_report(out, results, header, notes)


def cmd_drain(args: argparse.Namespace, out: Path, header: str) -> int:
    sizes = SizeMix.parse(args.sizes)

    def backlog(limit_per_s: float) -> int:
        return int(args.jobs or math.ceil(args.work_s * limit_per_s))

    results: list[StepResult] = []
    for n, target in each_target(args, out, "redis", backlog):
        step = Step(f"backlog {n}", all_at_once(n, sizes, args.seed), None)
        bar = progress_bar(n)
        results += run_steps(target, [step], new_nonce(), args.grace_s, bar)
        bar.close()
    plots.batch_histogram([r.summary for r in results], out / "batch-sizes.png")
    rates = {str(r.summary.extra["target"]): r.summary.steady_rate or 0.0 for r in results}
    limits = {str(r.summary.extra["target"]): _limit(r.summary) for r in results}
    notes = ["throughput: jobs done between the first and the last completion, on Redis's "
             "clock, the first batch left out (stats.steady_rate)"]
    return finish_report(out, results, header, notes + _baseline_notes(rates, limits, "drained at"))


def cmd_ceiling(args: argparse.Namespace, out: Path, header: str) -> int:
    ceiling = measure_ceiling(args.rates, args.duration, args.url)
    results = [StepResult(s, []) for s in ceiling.points]
    note = (f"generator ceiling: {ceiling.rate:,.0f} jobs/s kept (delivered >= 95 %, 99 % of "
            f"jobs started within 10 ms of schedule), each job a submit and a long-poll")
    return finish_report(out, results, header, [note])
