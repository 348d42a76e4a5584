"""An image classifier (resnet18 by default) on this machine's device: served
throughput at saturation against the offline best batch, and against per-job
serving, all in one run.

    python ops/bench/real_models.py --jobs 192 --sizes 1,4,8,16,32
    python ops/bench/real_models.py --device cuda --arch resnet50 --json out.json

``--device`` is ``auto`` by default: CUDA when torch sees it, else the CPU.

1. Offline: the handler's model path alone — pre-decoded 224 x 224 items,
   collate → device → forward → postprocess (``TorchExecutor.forward``) back to
   back at each batch size; the best rate is the denominator.
2. Served, ``configured``: a real Celery worker (the command of
   carpool/stack/commands.toml) with the torch executor, fast lane ``max_batch`` = the
   offline best size, ``max_wait_ms`` 10; a backlog of JPEGs (512 x 384, as the
   web stores them) admitted straight into Redis; rate = jobs completed between
   the end of the first batch and the last completion, on Redis's clock.
3. Served, ``per-job``: the same worker with ``max_batch`` 1.
4. Offline again, to show how much the shared machine drifted during the run.

On the CPU, worker and offline run torch with one intra-op thread
(CARPOOL_TORCH_THREADS=1). Weights are random (``options.weights = "random"``):
speed does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from preprocess import photo, stored  # this folder

from carpool.backend import records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.jobs import new_job_id
from carpool.core.settings import ExecutorSettings
from carpool.stack.command_lines import python_argv
from carpool.stack.waiting import wait_until
from worker.executors.torch_executor import TorchExecutor
from worker.handlers.image import ImageHandler

# `python -m celery` by this interpreter: the GPU image has no `celery` on PATH.
WORKER_ARGV = [*python_argv("worker", node="bench@%h"), "--loglevel", "INFO"]
OPTIONS = {"arch": "resnet18", "weights": "random", "labels": "imagenet", "top_k": 5}
START_TIMEOUT_S, DRAIN_TIMEOUT_S = 120.0, 600.0
#: Intra-op threads on the CPU: a worker shares its cores (see docs/benchmarks.md).
CPU_THREADS = 1


def device_for(setting: str) -> str:
    """``auto``: CUDA when torch sees it, else the CPU; anything else as given."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def spec(max_batch: int, max_wait_ms: int, options: dict[str, Any] | None = None,
         ) -> ModelSpec:
    opts = {**OPTIONS, **(options or {})}
    return ModelSpec("classifier", "image", "pixels", (
        BinSpec("fast", 512 * 512, max_batch, max_wait_ms, 4096),
        BinSpec("slow", 40_000_000, 8, 50, 512)), max_input_bytes=8 << 20, options=opts)


def toml(s: ModelSpec) -> str:
    name = s.name
    lines = [f"[models.{name}]", f'kind = "{s.kind}"', f'measure = "{s.measure}"',
             f"max_input_bytes = {s.max_input_bytes}",
             f"[models.{name}.options]",
             *(f"{k} = {json.dumps(v)}" for k, v in s.options.items())]
    for b in s.bins:
        lines += [f"[[models.{name}.bins]]", f'name = "{b.name}"', f"max_size = {b.max_size}",
                  f"max_batch = {b.max_batch}", f"max_wait_ms = {b.max_wait_ms}",
                  f"max_depth = {b.max_depth}"]
    return "\n".join(lines) + "\n"


def one_batch(handler: ImageHandler, executor: TorchExecutor, items: list[Any]) -> None:
    bin_spec = handler.spec.bins[0]
    staged = executor.staging.to_device(handler.collate(items, bin_spec))
    handler.postprocess(executor.forward(handler, staged), len(items))


def offline(sizes: list[int], seconds: float, device: str = "cpu",
            options: dict[str, Any] | None = None) -> dict[int, float]:
    """Items per second of the model path at each batch size."""
    threads = CPU_THREADS if device == "cpu" else 0
    if threads:
        torch.set_num_threads(threads)
    handler = ImageHandler(spec(max(sizes), 10, options), device)
    handler.load()
    executor = TorchExecutor(ExecutorSettings(device=device, torch_threads=threads), device)
    item = handler.preprocess(json.loads(stored(photo(512, 384, 0))))
    rates = {}
    with torch.inference_mode():
        for n in sizes:
            one_batch(handler, executor, [item] * n)
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                one_batch(handler, executor, [item] * n)
                done += n
            executor.synchronize()
            rates[n] = done / (time.perf_counter() - t0)
    executor.close()
    return rates


def served(redis_url: str, s: ModelSpec, inputs: list[str], workdir: Path,
           device: str = "cpu") -> dict[str, Any]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    config = workdir / f"{prefix}.toml"
    config.write_text(toml(s))
    log = workdir / f"{prefix}.log"
    env = {**os.environ, "CARPOOL_REDIS_URL": redis_url, "CARPOOL_KEY_PREFIX": prefix,
           "CARPOOL_CONFIG": str(config), "CARPOOL_MODELS": s.name, "CARPOOL_DEVICE": device,
           "CARPOOL_TORCH_THREADS": str(CPU_THREADS if device == "cpu" else 0),
           "CARPOOL_CALIBRATE": "never", "CARPOOL_WORKER_METRICS_PORT": "0"}
    worker = subprocess.Popen([*WORKER_ARGV, "--logfile", str(log)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = connect(redis_url)
    queue = Queue(client, Keys(prefix))
    try:
        def exited() -> None:
            if worker.poll() is not None:
                raise SystemExit(f"worker exited; see {log}")

        # A process we just started: no event to wait on.
        wait_until(lambda: log.exists() and "ready." in log.read_text(), START_TIMEOUT_S,
                   f"the worker to start (see {log})", check=exited, poll_s=0.2)
        fast = s.bins[0]
        admissions = Admissions(queue.client, queue.keys)
        ids = [single_admitted(admissions.admit(AdmitRequest(
            s, (AdmitJob(fast, new_job_id(s.name), x),), queued_ttl_s=3600))).id
               for x in inputs]
        wait_until(lambda: all((v := queue.get(i)) is not None and v.status.is_final
                               for i in ids), DRAIN_TIMEOUT_S, "the backlog to drain",
                   poll_s=0.5)
        return summarise(client, queue, ids)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        keys = [k for pattern in Keys(prefix).patterns
                for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)


def summarise(client: Any, queue: Queue, ids: list[str]) -> dict[str, Any]:
    fields = [records.read(client, queue.keys.job(i)) or {} for i in ids]
    rows = [(f.get("t_done", "0"), f.get("status"), f.get("batch")) for f in fields]
    done = sorted(int(t) for t, st, _ in rows if st == "done")
    sizes = [json.loads(b)["size"] for _, st, b in rows if st == "done" and b]
    first = sizes[0] if sizes else 1
    span_s = (done[-1] - done[first - 1]) / 1000.0
    return {"jobs": len(ids), "done": len(done), "jobs_per_s": (len(done) - first) / span_s,
            "mean_batch": sum(sizes) / len(sizes), "failed": len(ids) - len(done)}


def run(redis_url: str, device: str, sizes: list[int], seconds: float, jobs: int,
        options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Offline ladder, served at the best batch, served per job, offline around them."""
    ladder = offline(sizes, seconds, device, options)
    best_n = max(ladder, key=lambda n: ladder[n])
    inputs = [stored(photo(512, 384, seed)) for seed in range(jobs)]
    offline_runs = [ladder[best_n]]
    with tempfile.TemporaryDirectory() as tmp:
        configured = served(redis_url, spec(best_n, 10, options), inputs, Path(tmp), device)
        offline_runs.append(offline([best_n], seconds, device, options)[best_n])
        per_job = served(redis_url, spec(1, 0, options), inputs, Path(tmp), device)
    offline_runs.append(offline([best_n], seconds, device, options)[best_n])
    return {"device": device, "arch": spec(1, 0, options).options["arch"],
            "offline_items_per_s": ladder, "best_batch": best_n,
            "offline_best_runs": offline_runs, "configured": configured, "per_job": per_job}


def report(r: dict[str, Any]) -> None:
    ladder, best_n, offline_runs = r["offline_items_per_s"], r["best_batch"], r["offline_best_runs"]
    print(f"{r['arch']} on {r['device']}")
    print("offline (model path, pre-decoded items), items/s by batch size: "
          + ", ".join(f"{n}: {v:.1f}" for n, v in ladder.items()))
    print(f"offline best (batch {best_n}) before / between / after the served runs: "
          + " / ".join(f"{v:.1f}" for v in offline_runs))
    # Each served run is compared with the offline runs just before and after it.
    configured, per_job = r["configured"], r["per_job"]
    for name, s, around in (("configured", configured, offline_runs[0:2]),
                            ("per-job", per_job, offline_runs[1:3])):
        ref = sum(around) / 2
        print(f"served {name}: {s['jobs_per_s']:.1f} jobs/s, mean batch {s['mean_batch']:.1f}, "
              f"{s['done']}/{s['jobs']} done; {s['jobs_per_s'] / ref:.2f} of offline best "
              f"(mean of the runs around it, {ref:.1f})")
    print(f"configured / per-job: {configured['jobs_per_s'] / per_job['jobs_per_s']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=192)
    p.add_argument("--sizes", default="1,4,8,16,32")
    p.add_argument("--seconds", type=float, default=3.0, help="offline, per batch size")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda[:N]")
    p.add_argument("--arch", default=OPTIONS["arch"], help="a torchvision classifier")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    result = run(args.redis_url, device_for(args.device), sizes, args.seconds, args.jobs,
                 {"arch": args.arch})
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
