"""``carpool bench``: argument parsing only; the subcommands live in ``commands``."""

from __future__ import annotations

import argparse
import sys

from carpool.bench import subcommands as commands
from carpool.bench.ceiling import DEFAULT_RATES
from carpool.bench.client import PROTOCOLS
from carpool.bench.policies import POLICIES
from carpool.bench.sweep import DEFAULT_FRACTIONS
from carpool.core.clihelp import HelpParser
from carpool.core.errors import CarpoolError


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") \
            from None


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") \
            from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one, each >= 1")
    return values


def _cost(text: str) -> tuple[float, float]:
    values = _floats(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: want 'a,b' (ms per batch, ms per job)")
    return values[0], values[1]


def _common(p: argparse.ArgumentParser, transport: bool = True) -> None:
    g = p.add_argument_group("target")
    g.add_argument("--url", default="", help="drive a running stack's web tier (no baselines)")
    if transport:
        g.add_argument("--transport", choices=("http", "redis"), default="http",
                       help="http: the whole path; redis: admit straight into Redis "
                            "(the workers alone)")
    if transport:
        g.add_argument("--protocol", choices=PROTOCOLS, default="poll",
                       help="http: poll = POST /submit + GET /result?wait; wait = POST "
                            "/submit?wait; v2 = POST /v2/models/<m>/infer (docs/v2.md)")
    g.add_argument("--policies", default="configured",
                   help=f"comma-separated, each in a fresh stack: {', '.join(POLICIES)}")
    g.add_argument("--workers", type=_ints, default=[1],
                   help="Celery workers per stack; a list (1,2) runs a stack for each")
    g.add_argument("--web-workers", type=int, default=None,
                   help="gunicorn -w (default: CARPOOL_WEB_WORKERS, else 2)")
    g.add_argument("--redis-url", default="redis://127.0.0.1:6379/0",
                   help="the Redis the stacks use (and --transport redis admits into)")
    g.add_argument("--key-prefix", default="", help="a running stack's CARPOOL_KEY_PREFIX")
    g.add_argument("--cost-ms", type=_cost, default=(20.0, 1.0),
                   help="the synthetic model's a,b (ms per batch, ms per job) for the "
                        "workers this command starts")
    w = p.add_argument_group("workload")
    w.add_argument("--sizes", default="16", help="input sizes, e.g. 16 or 16:0.7,200:0.3")
    w.add_argument("--seed", type=int, default=1, help="random seed of arrivals and sizes")
    w.add_argument("--client-timeout-s", type=float, default=0.0,
                   help="each client gives up this long after its job's scheduled arrival "
                        "(counted as 'timeout'); 0: never (http transport)")
    w.add_argument("--grace-s", type=float, default=60.0,
                   help="after the last arrival, how long results may take before 'lost'")
    p.add_argument("--out", default="", help="output folder (default bench-out/<cmd>-<time>)")


#: What `carpool bench --help` tells a user.
DESCRIPTION = """\
Load generator and benchmarks: drive a carpool stack (one it starts, fresh, per
policy and worker count; or a running one with --url) and write a report with
latency percentiles, throughput, batch sizes and plots.

  carpool bench run       one schedule (Poisson, bursts or a trace) per policy
  carpool bench sweep     a series of rates per policy, and the knee of each curve
  carpool bench drain     a backlog straight into Redis: the workers' saturated rate
  carpool bench ceiling   the generator's own ceiling against a trivial server
  carpool bench simulate  the batching policies in the simulator, in seconds, no
                          processes (its own options: simulate --help)
  carpool bench simulate-scaling  autoscaling policies on bursty and daily traces

Each has its own --help; docs/benchmarks.md shows results and exact commands."""


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="carpool bench", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands", parser_class=HelpParser)

    run = sub.add_parser("run", help="one schedule per policy")
    _common(run)
    run.add_argument("--rate", type=float, required=True, help="jobs/s (the base rate for bursts)")
    run.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    run.add_argument("--arrivals", choices=("poisson", "bursts", "trace"), default="poisson",
                     help="how jobs arrive")
    run.add_argument("--burst-factor", type=float, default=4.0,
                     help="bursts: the rate during a burst, times --rate")
    run.add_argument("--burst-s", type=float, default=1.0, help="bursts: each burst's length")
    run.add_argument("--period-s", type=float, default=5.0, help="bursts: one every this long")
    run.add_argument("--trace", default="", help="JSON lines {t, size?, value?} (arrivals=trace)")

    sweep = sub.add_parser("sweep", help="a series of rates per policy; the knee of each")
    _common(sweep)
    sweep.add_argument("--capacity", default="limit",
                       help="jobs/s that the fractions refer to; 'limit': each policy's "
                            "analytical limit max_batch/(a+b·max_batch) × workers")
    sweep.add_argument("--fractions", type=_floats, default=list(DEFAULT_FRACTIONS),
                       help="offered rates, as fractions of --capacity")
    sweep.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    sweep.add_argument("--knee-k", type=float, default=2.0,
                       help="healthy: p99 <= k × the lowest rate's p99")
    sweep.add_argument("--knee-delivered", type=float, default=0.95,
                       help="healthy: achieved >= this × offered")

    drain = sub.add_parser("drain", help="N jobs straight into Redis; time until all are done")
    _common(drain, transport=False)
    drain.add_argument("--jobs", type=int, default=0,
                       help="the backlog; default: --work-s seconds of work at each limit")
    drain.add_argument("--work-s", type=float, default=8.0,
                       help="size each backlog to this many seconds at its analytical limit")

    tenants = sub.add_parser("tenants", help="two API keys on one bin: one floods, one is quiet")
    _common(tenants, transport=False)
    tenants.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals")
    tenants.add_argument("--flood", type=float, default=10.0,
                         help="the flooding tenant's rate, × the analytical limit")
    tenants.add_argument("--quiet", type=float, default=0.2,
                         help="the quiet tenant's rate, × the analytical limit")

    ceiling = sub.add_parser("ceiling", help="the generator's ceiling against a trivial server")
    ceiling.add_argument("--url", default="", help="default: a stub server of our own")
    ceiling.add_argument("--rates", type=_floats, default=list(DEFAULT_RATES),
                         help="offered rates, jobs/s")
    ceiling.add_argument("--duration", type=float, default=3.0, help="seconds per rate")
    ceiling.add_argument("--out", default="", help="output folder (default bench-out/<cmd>-<time>)")
    # Listed for --help only: carpool.cli hands "bench simulate ..." to carpool.sim.cli
    # whole (the simulator imports the bench's arrivals; the bench never imports it).
    sub.add_parser("simulate", add_help=False,
                   help="the batching policies in the simulator (simulate --help)")
    sub.add_parser("simulate-scaling", add_help=False,
                   help="autoscaling policies on traces (simulate-scaling --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return commands.dispatch(args, argv)
    except (ValueError, RuntimeError, CarpoolError) as exc:
        print(f"carpool bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
