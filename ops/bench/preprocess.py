"""Image decode + resize off the GIL: a thread pool on Pillow's GIL-releasing paths
against a process pool, and what ``Image.draft`` (JPEG DCT scaling) adds.

    python ops/bench/preprocess.py --images 48 --workers 2

Each variant turns the same JPEG files (as the web stores them: base64 in JSON)
into 224 x 224 uint8 pixels, the image handler's item, and reports images per
second over the whole set. Threads run ``worker.handlers.imaging.decode``; the
process pool runs the same function in child processes (spawned, as a CUDA
worker would have to) and returns the pixels through a pipe.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import numpy as np
from PIL import Image

from worker.handlers import imaging
from worker.handlers.imaging import ImageGeometry, decode, image_bytes

GEOMETRY = ImageGeometry(resize=256, crop=224)


def photo(width: int, height: int, seed: int) -> bytes:
    """A JPEG that compresses like a photo: smooth gradients plus sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width * 255, y / height * 255, (x + y) / (width + height) * 255], -1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def stored(data: bytes) -> str:
    return json.dumps({"image_b64": base64.b64encode(data).decode("ascii"), "format": "JPEG"})


def preprocess(input_json: str) -> np.ndarray:
    return decode(image_bytes(json.loads(input_json)), GEOMETRY)


def preprocess_no_draft(input_json: str) -> np.ndarray:
    data = image_bytes(json.loads(input_json))
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        s = GEOMETRY.resize / min(w, h)
        rgb = im.convert("RGB").resize((round(w * s), round(h * s)), Image.Resampling.BILINEAR)
    left, top = (rgb.width - 224) // 2, (rgb.height - 224) // 2
    return np.array(rgb.crop((left, top, left + 224, top + 224)))


def rate(pool: Executor | None, fn: Callable[[str], Any], inputs: list[str], reps: int) -> float:
    """Median images per second over ``reps`` passes through ``inputs``."""
    rates = []
    for _ in range(reps + 1):  # the first pass warms the pool up, untimed
        t0 = time.perf_counter()
        if pool is None:
            for x in inputs:
                fn(x)
        else:
            list(pool.map(fn, inputs))
        rates.append(len(inputs) / (time.perf_counter() - t0))
    return statistics.median(rates[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=48)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    assert imaging.REDUCING_GAP  # the variant measured is the shipped one
    for label, (w, h) in (("640x480", (640, 480)), ("3000x2000", (3000, 2000))):
        inputs = [stored(photo(w, h, seed)) for seed in range(args.images)]
        kib = statistics.mean(len(x) for x in inputs) * 3 / 4 / 1024
        threads = ThreadPoolExecutor(args.workers)
        procs = ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn"))
        rows = {
            "serial, draft": rate(None, preprocess, inputs, args.reps),
            f"{args.workers} threads, draft (shipped)": rate(threads, preprocess, inputs,
                                                              args.reps),
            f"{args.workers} threads, no draft": rate(threads, preprocess_no_draft, inputs,
                                                      args.reps),
            f"{args.workers} processes, draft": rate(procs, preprocess, inputs, args.reps),
        }
        threads.shutdown()
        procs.shutdown()
        print(f"\n{label} JPEG, mean {kib:.0f} KiB, {args.images} images")
        for name, value in rows.items():
            print(f"  {name:32s} {value:8.1f} images/s")


if __name__ == "__main__":
    main()
