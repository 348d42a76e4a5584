"""The per-model torch options (``dtype``, ``channels_last``, ``compile``) measured
against fp32 in one run, on the device a worker would use.

    python ops/bench/torch_options.py --device cuda                  # resnet50, batch 64
    python ops/bench/torch_options.py --device cpu --arch resnet18 --crop 64 --batch 8 \\
        --variants fp32,bf16,channels_last                           # a CPU dry run

Each variant loads the image classifier (random weights) with its options, warms
up, then times ``--reps`` batches through the worker's own staging and forward
path (``worker.observe.calibrate.time_batch``: copy in, forward, copy out) and prints the
median and its ratio to fp32. Output: one JSON line per variant, then a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

import torch

from carpool.core.catalogue import BinSpec, builtin_models
from carpool.core.settings import ExecutorSettings
from worker.executors.torch_executor import TorchExecutor
from worker.handlers.image import ImageHandler
from worker.observe.calibrate import device_name, time_batch

#: Each variant's options over the fp32 baseline.
VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": {"dtype": "fp16"},
    "bf16": {"dtype": "bf16"},
    "channels_last": {"channels_last": True},
    "fp16+channels_last": {"dtype": "fp16", "channels_last": True},
    "compile": {"compile": True},
}


def measure(variant: str, args: argparse.Namespace) -> tuple[float, str]:
    base = builtin_models()["resnet18"]
    options = {**base.options, "arch": args.arch, "weights": "random", "resize": args.crop,
               "crop": args.crop, **VARIANTS[variant]}
    bin_spec = BinSpec("only", max_size=1 << 30, max_batch=args.batch, max_wait_ms=0,
                       max_depth=args.batch)
    spec = replace(base, options=options, bins=(bin_spec,))
    handler = ImageHandler(spec, args.device)
    handler.load()
    executor = TorchExecutor(ExecutorSettings(device=args.device), args.device)
    try:
        time_batch(executor, handler, bin_spec, args.batch, reps=args.warmup)
        return (time_batch(executor, handler, bin_spec, args.batch, reps=args.reps),
                device_name(executor))
    finally:
        executor.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--arch", default="resnet50", help="a torchvision classifier")
    p.add_argument("--crop", type=int, default=224, help="image side, pixels")
    p.add_argument("--batch", type=int, default=64, help="batch size timed")
    p.add_argument("--reps", type=int, default=20, help="timed batches (median kept)")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of variants")
    args = p.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    if "fp32" not in names:
        names.insert(0, "fp32")  # the baseline, measured in the same run
    results = {}
    for name in names:
        results[name], device = measure(name, args)
        print(json.dumps({"variant": name, "ms": round(results[name], 3), "device": device,
                          "arch": args.arch, "batch": args.batch}), flush=True)
    print(f"\n| variant | ms per batch of {args.batch} | / fp32 |\n|---|---|---|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.2f} | {ms / results['fp32']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
