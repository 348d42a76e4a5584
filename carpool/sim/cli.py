"""``carpool bench simulate``: compare batching policies in the simulator, in seconds.

    carpool bench simulate --loads 0.25,0.5,0.75,0.9,1.0,1.1 --patterns poisson,bursts

runs every policy (fixed windows 0, the catalogue's and a long one; adaptive;
adaptive with a p99 target) on the same seeded schedule at each load (a fraction
of the workers' capacity at full batches), then writes ``results.jsonl``,
``summary.md`` and one PNG per pattern to ``--out``, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from carpool.bench.arrivals import Bursts, load_trace
from carpool.bench.workload import SizeMix
from carpool.core.catalogue import load_catalogue
from carpool.core.clihelp import HelpParser
from carpool.core.errors import MissingExtra
from carpool.core.extras import require
from carpool.scheduling.batching import Cost
from carpool.sim.compare import Row, baseline_cost, sweep, verdicts
from carpool.sim.engine import SimConfig
from carpool.sim.plots import plot_sweep
from carpool.sim.policies import standard


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated numbers, please") from None


def _cost(text: str) -> Cost:
    values = _floats(text)
    if len(values) != 2 or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want 'a,b' (ms per batch, ms per job)")
    return Cost(values[0], values[1])


#: What `carpool bench simulate --help` tells a user.
DESCRIPTION = """\
Compare batching policies in the simulator, in seconds, with no processes:

  carpool bench simulate --loads 0.25,0.5,0.75,0.9,1.0,1.1 --patterns poisson,bursts

runs every policy (fixed windows of 0, the catalogue's and a long one; adaptive;
adaptive with a p99 target) on the same seeded schedule at each load (a fraction
of the workers' capacity at full batches), then writes results.jsonl, summary.md
and one PNG per pattern to --out, and prints the table."""


def build_parser() -> argparse.ArgumentParser:
    p = HelpParser(prog="carpool bench simulate", description=DESCRIPTION)
    p.add_argument("--model", default="synthetic", help="a model of the catalogue")
    p.add_argument("--config", default="", help="a catalogue TOML file (CARPOOL_CONFIG)")
    p.add_argument("--cost-ms", type=_cost, default=Cost(20.0, 1.0),
                   help="the model's true t(n) = a + b·n, as 'a,b' ms (default 20,1)")
    p.add_argument("--jitter", type=float, default=0.05,
                   help="lognormal sigma on each batch's time (default 0.05)")
    p.add_argument("--overhead-ms", type=float, default=0.0,
                   help="worker time per batch outside t(n) (e.g. measured in a real run)")
    p.add_argument("--workers", type=int, default=1, help="simulated workers")
    p.add_argument("--loads", type=_floats, default=[0.25, 0.5, 0.75, 0.9, 1.0, 1.1],
                   help="offered loads, as fractions of capacity")
    p.add_argument("--patterns", default="poisson,bursts",
                   help="poisson, bursts, diurnal (a sine over the run, ±80 %%)")
    p.add_argument("--burst-factor", type=float, default=4.0, help="bursts: rate multiple")
    p.add_argument("--burst-s", type=float, default=1.0, help="bursts: seconds each")
    p.add_argument("--period-s", type=float, default=10.0, help="bursts: one every this long")
    p.add_argument("--trace", default="", help="replay this trace instead (JSON lines)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--sizes", default="16", help="input sizes, e.g. 16 or 16:0.6,200:0.4")
    p.add_argument("--slo-ms", type=int, default=None, help="p99 target of the SLO policy")
    p.add_argument("--seed", type=int, default=1, help="random seed of the schedule")
    p.add_argument("--out", default="", help="output folder (default sim-out/<time>)")
    p.add_argument("--no-plots", action="store_true", help="write no PNGs")
    return p


def markdown(rows: Sequence[Row]) -> str:
    """One table per pattern: a row per load, p50 / p99 / jobs/s and batch per policy."""
    out = []
    policies = list(dict.fromkeys(r.policy for r in rows))
    for pattern in dict.fromkeys(r.pattern for r in rows):
        out += [f"### {pattern}", "", "| load | " + " | ".join(policies) + " |",
                "|---|" + "---|" * len(policies)]
        for load in sorted({r.load for r in rows if r.pattern == pattern}):
            cells = []
            for policy in policies:
                s = next(r.summary for r in rows
                         if r.pattern == pattern and r.load == load and r.policy == policy)
                cells.append(f"{s.p50_ms:.0f} / {s.p99_ms:.0f} / {s.throughput_per_s:.0f} "
                             f"/ {s.mean_batch:.1f}")
            out.append(f"| {load:.0%} | " + " | ".join(cells) + " |")
        out.append("")
    out.append("Cells: p50 ms / p99 ms / jobs/s / mean batch.")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        require("matplotlib")  # the plots, drawn at the end: say so before the sweep
    except MissingExtra as exc:
        print(f"carpool bench simulate: {exc}", file=sys.stderr)
        return 2
    spec = load_catalogue(Path(args.config) if args.config else None).get(args.model)
    sizes = SizeMix.parse(args.sizes)
    base = SimConfig(spec, args.cost_ms, workers=args.workers, jitter=args.jitter, seed=args.seed,
                     overhead_us=round(args.overhead_ms * 1000))
    policies = standard(spec, args.cost_ms, args.slo_ms)
    trace = load_trace(Path(args.trace), sizes, args.seed) if args.trace else None
    out = Path(args.out or f"sim-out/{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"{spec.name}: {baseline_cost(spec, args.cost_ms)}; {args.workers} worker(s)",
          file=sys.stderr)
    started = time.perf_counter()
    bursts = Bursts(args.burst_factor, args.burst_s, args.period_s)
    rows = sweep(spec, base, policies, args.loads, args.patterns.split(","), sizes,
                 args.duration, trace=trace, bursts=bursts,
                 progress=lambda r: print(f"  {r.pattern} {r.load:.0%} {r.policy}: "
                                          f"p99 {r.summary.p99_ms:.1f} ms", file=sys.stderr))
    with (out / "results.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row.to_json()) + "\n")
    fixed = [p.name for p in policies if not p.adaptive]
    checks = verdicts(rows, "adaptive", fixed, fixed[1])
    table = markdown(rows) + "\n\nGoals (adaptive vs fixed windows):\n\n" + "\n".join(
        f"- {line}" for line in checks) + "\n"
    (out / "summary.md").write_text(table)
    if not args.no_plots:
        plot_sweep(rows, out)
    print(table)
    print(f"{len(rows)} runs in {time.perf_counter() - started:.1f} s; wrote {out}/",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
