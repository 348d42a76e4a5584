"""``PipelinedExecutor``: batches on one compute thread, ``depth`` in flight, no torch.

``submit`` preprocesses a batch (on a thread pool, or on the loop's thread with
no pool) and collates it on the loop's thread; one compute thread runs forward
and postprocess, splitting a failing batch to isolate its cause
(``runner.isolate``). At depth 1 the loop waits for each batch before it claims
the next: the synthetic model's worker, and any worker asked for no overlap.
``worker.executors.torch_executor.TorchExecutor`` adds the device: pinned
buffers, CUDA streams, ``inference_mode``, out-of-memory recovery.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from carpool.core.catalogue import BinSpec
from carpool.core.jobs import ClaimedJob, Outcome
from worker.device.memory import MemoryGuard
from worker.executors.base import ExecutorStats, padding_share
from worker.executors.runner import (
    HANDLER_ERRORS,
    checked,
    is_out_of_memory,
    isolate,
    outcomes,
    preprocess_all,
)
from worker.handlers.base import ModelHandler, SizedItems

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Ran:
    """What one batch did on the compute thread, for the memory guard."""

    largest_ok: int = 0  # the largest (sub-)batch that ran cleanly
    out_of_memory: bool = False


class _FirstTry:
    """The batch ``submit`` staged, used once by the first try of its whole batch."""

    def __init__(self, staged: Any | None) -> None:
        self._staged = staged

    def take(self) -> Any | None:
        staged, self._staged = self._staged, None
        return staged


class PipelinedExecutor:
    """Runs batches on one compute thread, ``depth`` in flight; no device, no torch."""

    def __init__(self, depth: int = 1, preprocess_threads: int = 0,
                 guard: MemoryGuard | None = None) -> None:
        self.depth = depth
        self.guard = guard or MemoryGuard(None)
        self.stats = ExecutorStats()
        #: None: preprocess on the loop's thread (one input at a time).
        self._preprocess = (ThreadPoolExecutor(preprocess_threads,
                                               thread_name_prefix="carpool-preprocess")
                            if preprocess_threads > 0 else None)
        # One compute thread: batches reach the model one after another, in order.
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="carpool-compute")
        self._lock = threading.Lock()

    # -- what a device executor overrides ------------------------------------------------
    def to_device(self, batch: Any) -> Any:
        """Start moving a collated batch to where the model runs."""
        return batch

    def forward(self, handler: ModelHandler, staged: Any) -> Any:
        """The model's output for a staged batch, on the host."""
        return handler.forward(staged)

    def inference_context(self) -> contextlib.AbstractContextManager[Any]:
        """Entered on the compute thread around each batch."""
        return contextlib.nullcontext()

    def release(self) -> None:
        """Free what an out-of-memory error or an unloaded model left behind."""

    # -- the pipeline ----------------------------------------------------------------------
    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return self.guard.limit((model, bin_name), max_batch)

    def view_limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return self.guard.view((model, bin_name), max_batch)

    def collate(self, handler: ModelHandler, items: Sequence[Any], bin_spec: BinSpec) -> Any:
        """``items`` in the bin's shape; the share that is padding is counted."""
        batch = handler.collate(items, bin_spec)
        if isinstance(handler, SizedItems):
            waste = padding_share([handler.item_size(i) for i in items], bin_spec.max_size)
            if waste is not None:
                with self._lock:
                    self.stats.record_padding((handler.spec.name, bin_spec.name), waste)
        return batch

    def stage(self, handler: ModelHandler, items: Sequence[Any], bin_spec: BinSpec) -> Any:
        """Collate ``items`` into the bin's shape and start moving them to the device."""
        return self.to_device(self.collate(handler, items, bin_spec))

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        mapper = self._preprocess.map if self._preprocess is not None else map
        ready, failed, pre_ms = preprocess_all(handler, jobs, mapper)
        items = [item for _, item in ready]
        staged = None
        if items:
            try:
                staged = self.stage(handler, items, bin_spec)
            except HANDLER_ERRORS:  # the compute thread isolates the cause
                log.warning("collating a batch of %d failed; isolating the input", len(items))
        first = _FirstTry(staged)

        def compute() -> list[Outcome]:
            t0 = time.perf_counter()
            results = self.run_isolated(handler, bin_spec, items, first)
            inf_ms = (time.perf_counter() - t0) * 1000.0
            return outcomes(jobs, ready, failed, results, pre_ms, inf_ms)

        return self._compute.submit(compute)

    def run_isolated(self, handler: ModelHandler, bin_spec: BinSpec, items: Sequence[Any],
                     first: _FirstTry | None = None) -> list[Any]:
        """One result per item (``runner._Failed`` for inputs that fail alone)."""
        key = (handler.spec.name, bin_spec.name)
        first = first or _FirstTry(None)
        oom = threading.Event()
        ran = Ran()

        def infer(sub: Sequence[Any]) -> list[Any]:
            cap = self.guard.cap(key)
            if cap is not None and len(sub) > cap:
                # Larger than the bin's cap now: staged (or split in halves) before an
                # out-of-memory error lowered it. Run it in parts of the cap rather
                # than meet a second one.
                first.take()
                log.info("%s/%s: %d jobs over the cap of %d; run in parts", key[0], key[1],
                         len(sub), cap)
                return [r for i in range(0, len(sub), cap)
                        for r in isolate(infer, sub[i:i + cap], on_split)]
            if oom.is_set():
                oom.clear()
                self.release()
            # The first try uses the batch staged by submit; retries stage their part.
            batch = first.take() if len(sub) == len(items) else None
            if batch is None:
                batch = self.stage(handler, sub, bin_spec)
            results = checked(handler, handler.postprocess(self.forward(handler, batch),
                                                           len(sub)), len(sub))
            ran.largest_ok = max(ran.largest_ok, len(sub))
            return results

        def on_split(exc: BaseException, n: int) -> None:
            with self._lock:
                if is_out_of_memory(exc):
                    self.stats.oom_splits += 1
                    ran.out_of_memory = True
                    self.guard.on_out_of_memory(key, n)
                    oom.set()  # free memory once the exception (and its frames) are gone
                else:
                    self.stats.error_splits += 1

        try:
            with self.inference_context():
                return isolate(infer, items, on_split) if items else []
        finally:
            first.take()
            with self._lock:
                self.stats.batches += 1
            # Teaches the guard, and the periodic empty_cache, between batches only.
            self.guard.after_batch(key, ran.largest_ok, ran.out_of_memory)

    def on_compute(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the compute thread, the one that serves: cuDNN's plan cache
        and cudagraph trees are per thread, so warm-up and calibration done on any
        other thread would leave serving to autotune every size again."""
        return self._compute.submit(fn).result()

    def close(self) -> None:
        if self._preprocess is not None:
            self._preprocess.shutdown(wait=True)
        self._compute.shutdown(wait=True)
