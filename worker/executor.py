"""The torch executor: a depth-2 pipeline from claimed jobs to results.

On the loop's thread, ``submit`` preprocesses a batch (a thread pool: Pillow and
the tokenizer release the GIL), collates it into the bin's shape and starts its
copy to the device (``staging``). The forward pass, the copy back and
postprocessing run on one compute thread, in ``torch.inference_mode`` and, on a
GPU, on a compute stream that waits for the copy's event. So while batch N
computes, the loop claims, preprocesses and copies batch N+1.

A failing forward pass is split in halves (``runner.isolate``): an input that
breaks the model fails alone, and an out-of-memory error frees the allocator's
cache, halves the bin's limit in the memory guard and retries the halves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from carpool.catalogue import BinSpec
from carpool.jobs import ClaimedJob, Outcome
from carpool.settings import ExecutorSettings
from worker.handlers.base import ModelHandler
from worker.memory import MemoryGuard
from worker.runner import checked, is_out_of_memory, isolate, outcomes, preprocess_all
from worker.staging import Staged, Staging, to_host

log = logging.getLogger(__name__)


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
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        if isinstance(mask, torch.Tensor):
            real = int(mask.sum())
            self.real_tokens += real
            self.padding_tokens += mask.numel() - real


def memory_guard(settings: ExecutorSettings, device: torch.device) -> MemoryGuard:
    """A guard reading this device's memory; on the CPU, one that only OOMs drive."""
    if device.type != "cuda":
        return MemoryGuard(None)
    return MemoryGuard(
        lambda: torch.cuda.mem_get_info(device),
        lambda: (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)),
        watermark_fraction=settings.free_watermark,
        empty_cache=torch.cuda.empty_cache,
        empty_cache_every=settings.empty_cache_every,
    )


class TorchExecutor:
    """Runs batches of torch handlers on one device, ``depth`` in flight."""

    def __init__(self, settings: ExecutorSettings, device: str,
                 guard: MemoryGuard | None = None) -> None:
        self.device = torch.device(device)
        self.depth = settings.pipeline_depth
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # one shape per bin: autotune pays off
        self.guard = guard or memory_guard(settings, self.device)
        self.stats = ExecutorStats()
        self.staging = Staging(self.device)
        self.compute_stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.device.type == "cuda" else None)
        self._preprocess = ThreadPoolExecutor(settings.preprocess_threads,
                                              thread_name_prefix="carpool-preprocess")
        # One compute thread: batches reach the device one after another, in order.
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="carpool-compute")
        self._lock = threading.Lock()
        #: When a list (tests, profiling): CUDA events "copy_start", "copy_end",
        #: "compute_start", "compute_end" of every batch, in the order recorded.
        self.trace: list[tuple[str, torch.cuda.Event]] | None = None

    def _mark(self, name: str, stream: torch.cuda.Stream | None) -> None:
        if self.trace is not None and stream is not None:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record(stream)
            self.trace.append((name, event))

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return self.guard.limit((model, bin_name), max_batch)

    def stage(self, handler: ModelHandler, items: Sequence[Any], bin_spec: BinSpec) -> Staged:
        """Collate ``items`` into the bin's shape and start their copy to the device."""
        batch = handler.collate(items, bin_spec)
        with self._lock:
            self.stats.count_padding(batch)
        self._mark("copy_start", self.staging.copy_stream)
        staged = self.staging.to_device(batch)
        self._mark("copy_end", self.staging.copy_stream)
        return staged

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        ready, failed, pre_ms = preprocess_all(handler, jobs, self._preprocess.map)
        items = [item for _, item in ready]
        staged: list[Staged] = []
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
                     staged: list[Staged]) -> list[Any]:
        """One result per item (``runner._Failed`` for inputs that fail alone)."""
        key = (handler.spec.name, bin_spec.name)
        oom = threading.Event()

        def infer(sub: Sequence[Any]) -> list[Any]:
            if oom.is_set():
                oom.clear()
                self._release()
            # The first try uses the batch copied in by submit; retries copy their half.
            batch = staged.pop() if staged and len(sub) == len(items) else self.stage(
                handler, sub, bin_spec)
            return checked(handler, handler.postprocess(self.forward(handler, batch),
                                                        len(sub)), len(sub))

        def on_split(exc: BaseException, n: int) -> None:
            with self._lock:
                if is_out_of_memory(exc):
                    self.stats.oom_splits += 1
                    self.guard.on_out_of_memory(key, n)
                    oom.set()  # free memory once the exception (and its frames) are gone
                else:
                    self.stats.error_splits += 1

        try:
            with torch.inference_mode():
                return isolate(infer, items, on_split) if items else []
        finally:
            staged.clear()
            with self._lock:
                self.stats.batches += 1
            self.guard.after_batch()  # the periodic empty_cache, between batches only

    def forward(self, handler: ModelHandler, staged: Staged) -> Any:
        """Forward pass on the compute stream; the output back on the host."""
        if self.compute_stream is None:
            return to_host(handler.forward(staged.batch))
        with torch.cuda.stream(self.compute_stream):
            batch = self.staging.enter_compute(staged, self.compute_stream)
            self._mark("compute_start", self.compute_stream)
            output = handler.forward(batch)
            self._mark("compute_end", self.compute_stream)
            return to_host(output)

    def _release(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            log.info("after out of memory: %s", self.memory_summary())

    def memory_summary(self) -> str:
        if self.device.type != "cuda":
            return "CPU"
        mib = 1 << 20
        return (f"allocated {torch.cuda.memory_allocated(self.device) // mib} MiB, "
                f"reserved {torch.cuda.memory_reserved(self.device) // mib} MiB")

    def close(self) -> None:
        self._preprocess.shutdown(wait=True)
        self._compute.shutdown(wait=True)
