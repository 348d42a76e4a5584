"""A model's offline best-batch throughput: its handler called directly in a loop.

    python ops/bench/offline.py --model synthetic --bin small --sizes 1,8,16,32

No queue, no web, no Redis: preprocess → collate → forward → postprocess, the
way the worker's executor runs a batch (``PipelinedExecutor.run_isolated``), back
to back for a few
seconds per batch size. The best figure is the physical limit for that model on
this device, the number every served throughput is a fraction of. It imports
the worker (and torch, for real models), so it lives in ops/, not carpool/.
Settings come from the environment as for a worker (CARPOOL_SYNTHETIC_COST_MS).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from carpool.core.settings import load_settings
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers import make_handler


def sample_inputs(model: str, n: int) -> list[Any]:
    if model != "synthetic":
        raise SystemExit(f"no sample inputs for {model!r} yet; pass --input-json")
    return [{"value": i, "size": 16} for i in range(n)]


def measure(handler: Any, bin_name: str, inputs: list[Any], seconds: float) -> float:
    """Jobs per second at this batch size, over at least ``seconds`` of batches."""
    bin_spec = handler.spec.bin_named(bin_name)
    executor = PipelinedExecutor()
    try:
        executor.run_isolated(handler, bin_spec, [handler.preprocess(x) for x in inputs])
        done, t0 = 0, time.perf_counter()  # after a warm-up batch
        while (elapsed := time.perf_counter() - t0) < seconds:
            executor.run_isolated(handler, bin_spec, [handler.preprocess(x) for x in inputs])
            done += len(inputs)
        return done / elapsed
    finally:
        executor.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic")
    p.add_argument("--bin", default="small")
    p.add_argument("--sizes", default="1,2,4,8,16,32")
    p.add_argument("--seconds", type=float, default=2.0, help="per batch size")
    p.add_argument("--input-json", default="", help="one input to repeat (real models)")
    args = p.parse_args(argv)
    settings = load_settings()
    handler = make_handler(settings.catalogue.get(args.model), settings)
    handler.load()
    rates = {}
    for n in [int(x) for x in args.sizes.split(",")]:
        inputs = ([json.loads(args.input_json)] * n if args.input_json
                  else sample_inputs(args.model, n))
        rates[n] = measure(handler, args.bin, inputs, args.seconds)
        print(f"batch {n:4d}: {rates[n]:9.1f} jobs/s", flush=True)
    best = max(rates, key=lambda n: rates[n])
    print(json.dumps({"model": args.model, "bin": args.bin, "best_batch": best,
                      "best_jobs_per_s": round(rates[best], 1),
                      "by_batch": {str(n): round(r, 1) for n, r in rates.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
