"""What the batching loop asks of an executor, and the torch-free executors.

The loop claims a batch, hands it to ``submit`` and keeps at most ``depth``
batches in flight: with depth 2, batch N+1 is claimed, preprocessed and copied
to the device while batch N computes. ``limit`` is asked once per batch, before
the claim, so the memory guard can shrink a bin's batch.

``PipelinedExecutor`` is that pipeline without torch: ``submit`` preprocesses on
a thread pool and collates on the loop's thread, and one compute thread runs
forward and postprocess, splitting a failing batch to isolate its cause
(``runner.isolate``). ``worker.executor.TorchExecutor`` adds the device: pinned
buffers, CUDA streams, ``inference_mode``, out-of-memory recovery.
``InlineExecutor`` runs each batch on the loop's thread (depth 1).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from carpool.catalogue import BinSpec
from carpool.jobs import ClaimedJob, Outcome
from worker.handlers.base import ModelHandler
from worker.memory import MemoryGuard
from worker.runner import (
    checked,
    is_out_of_memory,
    isolate,
    outcomes,
    preprocess_all,
    run_batch,
)

log = logging.getLogger(__name__)


class BatchExecutor(Protocol):
    #: Batches the loop may hold in flight at once (claimed, not yet completed).
    depth: int

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        """How many jobs the next batch of this bin may claim (≤ ``max_batch``)."""

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        """Start a batch; the future gives one Outcome per job, in order."""

    def close(self) -> None:
        """Release threads and buffers; called once the loop has stopped."""


class InlineExecutor:
    """Runs each batch on the loop's own thread as it is submitted (depth 1).

    The synthetic model needs nothing more, and it keeps a worker without torch
    models free of torch.
    """

    depth = 1

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return max_batch

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        future: Future[list[Outcome]] = Future()
        try:
            future.set_result(run_batch(handler, bin_spec, jobs))
        except Exception as exc:  # noqa: BLE001 — delivered to the loop through the future
            future.set_exception(exc)
        return future

    def close(self) -> None:
        return None


@dataclass
class Ran:
    """What one batch did on the compute thread, for the memory guard."""

    largest_ok: int = 0  # the largest (sub-)batch that ran cleanly
    out_of_memory: bool = False


@dataclass
class ExecutorStats:
    """Counters a metrics exporter reads (see also ``MemoryGuard``)."""

    batches: int = 0
    #: Sub-batches re-run after a failure: out of memory, or some input broke the model.
    oom_splits: int = 0
    error_splits: int = 0
    #: Token positions computed for real inputs, and for padding (text models).
    real_tokens: int = 0
    padding_tokens: int = 0

    @property
    def padding_waste_ratio(self) -> float:
        """Padding positions over all positions computed."""
        total = self.real_tokens + self.padding_tokens
        return self.padding_tokens / total if total else 0.0

    def count_padding(self, batch: Any) -> None:
        """Count a collated batch's ``attention_mask`` (a tensor), if it has one."""
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        if mask is not None and hasattr(mask, "numel"):
            real = int(mask.sum())
            self.real_tokens += real
            self.padding_tokens += int(mask.numel()) - real


class PipelinedExecutor:
    """Runs batches on one compute thread, ``depth`` in flight; no device, no torch."""

    def __init__(self, depth: int, preprocess_threads: int,
                 guard: MemoryGuard | None = None) -> None:
        self.depth = depth
        self.guard = guard or MemoryGuard(None)
        self.stats = ExecutorStats()
        self._preprocess = ThreadPoolExecutor(preprocess_threads,
                                              thread_name_prefix="carpool-preprocess")
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
        """Free what an out-of-memory error left behind, before the retry."""

    # -- the pipeline ----------------------------------------------------------------------
    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return self.guard.limit((model, bin_name), max_batch)

    def stage(self, handler: ModelHandler, items: Sequence[Any], bin_spec: BinSpec) -> Any:
        """Collate ``items`` into the bin's shape and start moving them to the device."""
        batch = handler.collate(items, bin_spec)
        with self._lock:
            self.stats.count_padding(batch)
        return self.to_device(batch)

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        ready, failed, pre_ms = preprocess_all(handler, jobs, self._preprocess.map)
        items = [item for _, item in ready]
        staged: list[Any] = []
        if items:
            try:
                staged.append(self.stage(handler, items, bin_spec))
            except Exception:  # noqa: BLE001 — the compute thread isolates the cause
                log.warning("collating a batch of %d failed; isolating the input", len(items))

        def compute() -> list[Outcome]:
            t0 = time.perf_counter()
            results = self.run_isolated(handler, bin_spec, items, staged)
            inf_ms = (time.perf_counter() - t0) * 1000.0
            return outcomes(jobs, ready, failed, results, pre_ms, inf_ms)

        return self._compute.submit(compute)

    def run_isolated(self, handler: ModelHandler, bin_spec: BinSpec, items: Sequence[Any],
                     staged: list[Any]) -> list[Any]:
        """One result per item (``runner._Failed`` for inputs that fail alone)."""
        key = (handler.spec.name, bin_spec.name)
        oom = threading.Event()
        ran = Ran()

        def infer(sub: Sequence[Any]) -> list[Any]:
            cap = self.guard.cap(key)
            if cap is not None and len(sub) > cap:
                # Larger than the bin's cap now: staged (or split in halves) before an
                # out-of-memory error lowered it. Run it in parts of the cap rather
                # than meet a second one.
                staged.clear()
                log.info("%s/%s: %d jobs over the cap of %d; run in parts", key[0], key[1],
                         len(sub), cap)
                return [r for i in range(0, len(sub), cap)
                        for r in isolate(infer, sub[i:i + cap], on_split)]
            if oom.is_set():
                oom.clear()
                self.release()
            # The first try uses the batch staged by submit; retries stage their part.
            batch = staged.pop() if staged and len(sub) == len(items) else self.stage(
                handler, sub, bin_spec)
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
            staged.clear()
            with self._lock:
                self.stats.batches += 1
            # Teaches the guard, and the periodic empty_cache, between batches only.
            self.guard.after_batch(key, ran.largest_ok, ran.out_of_memory)

    def close(self) -> None:
        self._preprocess.shutdown(wait=True)
        self._compute.shutdown(wait=True)
