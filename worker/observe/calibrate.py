"""Warm-up and calibration of a torch handler on its executor's device.

Calibration runs every distinct bin shape at a ladder of batch sizes (1, 2, 4,
… up to the bin's ``max_batch``; on a GPU on past it, up to
``PROBE_FACTOR`` × max_batch, to find the largest batch that fits), through the
same staging and forward path that serves jobs, and keeps the median time of
each. A worker reuses a profile from ``CARPOOL_PROFILE_DIR`` at its next start.
A probe that fails (out of memory, or any other error but a sticky CUDA error,
which fails the start: the context is lost) ends there: the bin's
ceiling in the memory guard is the largest batch that ran (``largest_fit``),
applied before warm-up, so a ``max_batch`` that does not fit never stops a
worker from starting. Warm-up then runs each bin shape once more (on a GPU at
every batch size it will serve, ``worker.executors.ladder``), so first jobs do not pay for
cuDNN's autotuning or the allocator's first growth.

``CARPOOL_CALIBRATE``: ``auto`` calibrates on a GPU when no profile is cached
(on the CPU it would take minutes and protects no memory: warm-up only),
``always`` calibrates at every start, ``never`` only warms up.
"""

from __future__ import annotations

import datetime as dt
import logging
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from carpool.core.catalogue import BinSpec
from carpool.core.settings import ExecutorSettings
from worker.device.tensor_tree import map_tensors
from worker.executors.ladder import rungs
from worker.executors.runner import is_out_of_memory, is_sticky
from worker.executors.staging import to_host
from worker.executors.torch_executor import TorchExecutor
from worker.handlers.base import ModelHandler
from worker.observe.profile import BinProfile, Point, Profile, digest, load, path_for, save, table

log = logging.getLogger(__name__)

#: On a GPU, probe batch sizes up to this multiple of a bin's max_batch for memory.
PROBE_FACTOR = 4
DEFAULT_REPS = 3


def device_name(executor: TorchExecutor) -> str:
    if executor.gpu is not None:
        return executor.gpu.name()
    return f"cpu {platform.machine()} x{torch.get_num_threads()} threads"


def ladder(max_batch: int, limit: int) -> list[int]:
    """Powers of two up to ``limit``, plus ``max_batch`` and ``limit`` themselves."""
    powers = {1 << i for i in range(limit.bit_length()) if 1 << i <= limit}
    return sorted(powers | {max_batch, limit})


def _example(handler: ModelHandler, bin_spec: BinSpec) -> Any:
    return handler.example(bin_spec)


def shape_of(handler: ModelHandler, bin_spec: BinSpec) -> str:
    """The per-item shape of a bin's batches, e.g. ``[3, 224, 224]``."""
    shapes: list[str] = []

    def note(path: str, t: torch.Tensor) -> torch.Tensor:
        shapes.append(f"{path}{list(t.shape[1:])}")
        return t

    map_tensors(handler.collate([_example(handler, bin_spec)], bin_spec), note)
    return " ".join(shapes) or "-"


def time_batch(executor: TorchExecutor, handler: ModelHandler, bin_spec: BinSpec, n: int,
               reps: int) -> float:
    """Median ms of ``reps`` batches of ``n`` (after one untimed run), copy in to copy out,
    on the executor's compute thread (where serving runs them)."""
    return executor.on_compute(lambda: _time_batch(executor, handler, bin_spec, n, reps))


def _time_batch(executor: TorchExecutor, handler: ModelHandler, bin_spec: BinSpec, n: int,
                reps: int) -> float:
    items = [_example(handler, bin_spec)] * n
    times = []
    with torch.inference_mode():
        for rep in range(reps + 1):
            executor.synchronize()
            t0 = time.perf_counter()
            staged = executor.staging.to_device(handler.collate(items, bin_spec))
            to_host(executor.forward(handler, staged))
            executor.synchronize()
            if rep:
                times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times) if times else 0.0


def sizes_for(executor: TorchExecutor, bin_spec: BinSpec, sizes: list[int] | None) -> list[int]:
    """``sizes``, or the ladder to max_batch (on a GPU on to PROBE_FACTOR x max_batch)."""
    if sizes:
        return sorted(set(sizes))
    factor = PROBE_FACTOR if executor.gpu is not None else 1
    return ladder(bin_spec.max_batch, bin_spec.max_batch * factor)


def calibrate_bin(executor: TorchExecutor, handler: ModelHandler, bin_spec: BinSpec,
                  reps: int, sizes: list[int]) -> BinProfile:
    """Time each size until one fails. Any failure ends the probe there, not only one
    typed as out of memory (cuBLAS and cuDNN raise their allocation failures as plain
    RuntimeErrors): it costs the bin a smaller ceiling, never the worker's start."""
    profile = BinProfile(bin_spec.name, shape_of(handler, bin_spec))
    for n in sizes:
        failed = False
        try:
            ms = time_batch(executor, handler, bin_spec, n, reps)
        except Exception as exc:  # noqa: BLE001 — any failure ends the probe at this size
            if is_sticky(exc):
                raise  # the CUDA context is lost: no ceiling makes this worker usable
            failed = True
            profile.out_of_memory_at = n
            level = logging.INFO if is_out_of_memory(exc) else logging.WARNING
            log.log(level, "calibrate %s/%s: batch %d failed (%s: %s); ceiling %d",
                    handler.spec.name, bin_spec.name, n, type(exc).__name__, exc,
                    max(1, profile.largest_fit))
        if failed:
            # Outside the except block: its traceback (the failed pass's frames and
            # tensors) is gone only once the block has ended (PyTorch's FAQ).
            executor.release()
            break
        profile.points.append(Point(n, round(ms, 3)))
        profile.largest_fit = n
        log.info("calibrate %s/%s batch %d: %.2f ms", handler.spec.name, bin_spec.name, n, ms)
    return profile


def calibrate(executor: TorchExecutor, handler: ModelHandler, reps: int = DEFAULT_REPS,
              sizes: list[int] | None = None) -> Profile:
    """Measure every bin of ``handler``; bins of one shape share their measurements."""
    name = device_name(executor)
    profile = Profile(handler.spec.name, name, digest(handler.spec, name, torch.__version__),
                      torch.__version__, dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    by_shape: dict[tuple[str, tuple[int, ...]], BinProfile] = {}
    for b in handler.spec.bins:
        key = (shape_of(handler, b), tuple(sizes_for(executor, b, sizes)))
        if key not in by_shape:
            by_shape[key] = calibrate_bin(executor, handler, b, reps, list(key[1]))
        measured = by_shape[key]
        profile.bins[b.name] = BinProfile(b.name, key[0], measured.points,
                                          measured.largest_fit, measured.out_of_memory_at)
    return profile


def warm_up(executor: TorchExecutor, handler: ModelHandler) -> None:
    """Run each bin shape once (batch 1) on the CPU; on a GPU at every rung of the
    ladder up to the bin's cap (``worker.executors.ladder``), the sizes it will serve, so
    cuDNN autotunes here and never on the serving path. A rung that fails caps
    the bin below it (the start goes on); batch 1 failing is a broken model."""
    done: set[tuple[str, int]] = set()
    for b in handler.spec.bins:
        key = (handler.spec.name, b.name)
        shape = shape_of(handler, b)
        limit = min(b.max_batch, executor.guard.cap(key) or b.max_batch)
        sizes = rungs(limit) if executor.pad_batches else [1]
        for n in sizes:
            if (shape, n) in done:
                continue
            failed = False
            try:
                time_batch(executor, handler, b, n, reps=0)
            except Exception as exc:  # noqa: BLE001 — a smaller ceiling, not a failed start
                if n == 1 or is_sticky(exc):
                    raise
                failed = True
                log.warning("warm-up of %s/%s failed at batch %d (%s: %s): capped at %d",
                            key[0], key[1], n, type(exc).__name__, exc, done_below(done, shape, n))
            if failed:  # outside the except block, as in calibrate_bin
                executor.release()
                executor.guard.set_ceiling(key, done_below(done, shape, n))
                break
            done.add((shape, n))


def done_below(done: set[tuple[str, int]], shape: str, n: int) -> int:
    """The largest size of ``shape`` that warmed up below ``n`` (at least 1)."""
    return max((m for s, m in done if s == shape and m < n), default=1)


def prepare(executor: TorchExecutor, handler: ModelHandler, settings: ExecutorSettings,
            ) -> Profile | None:
    """At worker start: reuse or make a profile (per ``settings.calibrate``), cap each
    bin whose probe failed at the largest batch that ran (``largest_fit``), and only
    then warm up, within those caps."""
    name = device_name(executor)
    key = digest(handler.spec, name, torch.__version__)
    path = path_for(settings.profile_dir, handler.spec, key)
    profile = None if settings.calibrate == "never" else load(path, key)
    wanted = settings.calibrate == "always" or (
        settings.calibrate == "auto" and profile is None and executor.gpu is not None)
    if wanted:
        profile = calibrate(executor, handler)
        if save(profile, path):  # else it warned: the worker serves on, uncached
            log.info("calibration profile written to %s", path)
        log.info("calibration of %s\n%s", handler.spec.name, table(profile))
    elif profile is not None:
        log.info("reusing calibration profile %s", path)
    for b in (profile.bins.values() if profile else ()):
        if b.out_of_memory_at is not None:
            executor.guard.set_ceiling((handler.spec.name, b.bin), max(1, b.largest_fit))
    warm_up(executor, handler)
    return profile


def plot(profile: Profile, path: Path) -> None:
    """Latency and throughput against batch size, one line per bin, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4.2))
    for b in profile.bins.values():
        xs = [p.batch for p in b.points]
        lat.plot(xs, [p.ms for p in b.points], marker="o", label=b.bin)
        thr.plot(xs, [p.items_per_s for p in b.points], marker="o", label=b.bin)
        thr.axvline(b.knee, linestyle=":", linewidth=0.8)
    for ax, ylabel in ((lat, "ms per batch"), (thr, "items per second")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    thr.legend(fontsize="small", ncol=2)
    fig.suptitle(f"{profile.model} on {profile.device} (dotted: knee)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def command(model: str, *, reps: int, sizes: list[int] | None, plot_path: Path | None) -> int:
    """``carpool calibrate MODEL``: measure, print the table, write the profile and a plot."""
    from carpool.core.settings import load_settings
    from worker.handlers import make_handler, resolve_device

    settings = load_settings()
    spec = settings.catalogue.get(model)
    handler = make_handler(spec, settings)
    handler.load()
    executor = TorchExecutor(settings.executor, resolve_device(settings.executor.device))
    try:
        profile = calibrate(executor, handler, reps, sizes)
    finally:
        executor.close()
    path = path_for(settings.executor.profile_dir, spec, profile.digest)
    saved = save(profile, path)
    print(table(profile))
    if not saved and plot_path is None:
        print("profile and plot not saved: see the warning above")
        return 0
    png = plot_path or path.with_suffix(".png")
    plot(profile, png)
    print(f"profile {path if saved else '(not saved: see the warning above)'}\nplot    {png}")
    return 0
