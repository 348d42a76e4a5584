"""What the worker adds to the ``carpool`` command line: ``carpool calibrate``.

Registered through the ``carpool.stack.command_lines`` entry point group (pyproject.toml),
so ``carpool/`` never imports ``worker/``. This module is torch-free: ``carpool
--help`` lists the command on a web-only install, and running it there says
which extra to install.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from carpool.core.extras import require


def positive_int(text: str) -> int:
    """A whole number of at least 1: --reps 0 would time nothing and write a profile of
    zero-ms points, which workers then reuse as measured."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def batch_sizes(text: str) -> list[int]:
    """``1,2,4,8``: batch sizes of at least 1, comma-separated."""
    try:
        return [positive_int(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}; give batch sizes like "
                                         "1,2,4,8") from None


def register(sub: Any) -> None:
    """Add ``calibrate`` to ``sub``, the ``carpool`` parser's subparsers."""
    c = sub.add_parser("calibrate", help="time a model's bins at several batch sizes "
                       "(needs the worker extra); writes the profile and a PNG plot")
    c.add_argument("model", help="a model of the catalogue (CARPOOL_CONFIG), e.g. synthetic")
    c.add_argument("--reps", type=positive_int, default=3,
                   help="timed batches per size (median kept)")
    c.add_argument("--sizes", type=batch_sizes, default=None, help="batch sizes, e.g. "
                   "1,2,4,8 (default: a ladder of powers of two up to each bin's max_batch)")
    c.add_argument("--plot", default="", help="PNG path (default: beside the profile)")
    c.epilog = ("Settings come from the environment, as for a worker: CARPOOL_CONFIG,\n"
                "CARPOOL_DEVICE, CARPOOL_PROFILE_DIR (where the profile is written).")
    c.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    require("torch", extra="worker")  # before the import that needs it: a clear message
    from worker.observe.calibrate import command

    return command(args.model, reps=args.reps, sizes=args.sizes,
                   plot_path=Path(args.plot) if args.plot else None)
