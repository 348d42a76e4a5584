"""What padding batches to the warm-up ladder costs (worker/executors/ladder.py), on the CPU.

    python ops/bench/padding_ladder.py --max-batch 64 --reps 50

On a GPU, the executor pads each batch up to a rung of the ladder so cuDNN never
autotunes on the serving path. Its costs, measured or counted here:

1. host CPU per batch: ``pad_rows`` (repeat the last 224 x 224 uint8 item) for
   each batch size, against collating the batch itself (``torch.stack``);
2. padded rows: the share of computed rows that are padding, for a batch size
   drawn uniformly from 1..max_batch (the worst mix: a busy worker runs full
   batches, which are never padded);
3. warm-up: the sizes to autotune per bin shape, ladder against every size.

The GPU side (autotuning time per new size, and the compute spent on padding
rows) needs a GPU: ``ops/gpu/check.sh``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from worker.executors.ladder import padded, rungs
from worker.executors.torch_executor import pad_rows

ITEM = (3, 224, 224)


def median_us(fn: object, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    torch.set_num_threads(1)
    top = args.max_batch
    print(f"max_batch {top}; ladder {rungs(top)}")
    print(f"{'n':>4} {'rung':>5} {'collate us':>11} {'pad us':>8} {'pad/collate':>12}")
    item = torch.zeros(ITEM, dtype=torch.uint8)
    pad_share = []
    for n in range(1, top + 1):
        rung = padded(n, top)
        pad_share.append((rung - n) / rung)
        if rung == n and n not in (1, top):
            continue
        items = [item.clone() for _ in range(n)]
        batch = torch.stack(items)
        collate = median_us(lambda items=items: torch.stack(items), args.reps)
        pad = median_us(lambda b=batch, n=n, r=rung: pad_rows(b, n, r), args.reps)
        print(f"{n:>4} {rung:>5} {collate:>11.0f} {pad:>8.0f} {pad / collate:>12.2f}")
    print(f"padding rows, batch size uniform in 1..{top}: mean "
          f"{statistics.mean(pad_share):.1%} of rows computed, worst {max(pad_share):.1%}")
    print(f"warm-up sizes per bin shape: ladder {len(rungs(top))}, every size {top}")


if __name__ == "__main__":
    main()
