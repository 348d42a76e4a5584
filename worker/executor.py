"""The torch executor: the depth-2 pipeline of ``worker.pipeline`` on a device.

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

import contextlib
import logging
from typing import Any

import torch

from carpool.settings import ExecutorSettings
from worker.handlers.base import ModelHandler
from worker.memory import MemoryGuard
from worker.pipeline import ExecutorStats, PipelinedExecutor
from worker.staging import Staged, Staging, to_host

log = logging.getLogger(__name__)

__all__ = ["ExecutorStats", "TorchExecutor", "memory_guard"]


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


class TorchExecutor(PipelinedExecutor):
    """Runs batches of torch handlers on one device, ``depth`` in flight."""

    def __init__(self, settings: ExecutorSettings, device: str,
                 guard: MemoryGuard | None = None) -> None:
        self.device = torch.device(device)
        super().__init__(settings.pipeline_depth, settings.preprocess_threads,
                         guard or memory_guard(settings, self.device))
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # one shape per bin: autotune pays off
        self.staging = Staging(self.device)
        self.compute_stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.device.type == "cuda" else None)
        #: When a list (tests, profiling): CUDA events "copy_start", "copy_end",
        #: "compute_start", "compute_end" of every batch, in the order recorded.
        self.trace: list[tuple[str, torch.cuda.Event]] | None = None

    def _mark(self, name: str, stream: torch.cuda.Stream | None) -> None:
        if self.trace is not None and stream is not None:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record(stream)
            self.trace.append((name, event))

    def to_device(self, batch: Any) -> Staged:
        self._mark("copy_start", self.staging.copy_stream)
        staged = self.staging.to_device(batch)
        self._mark("copy_end", self.staging.copy_stream)
        return staged

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

    def inference_context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.inference_mode()

    def release(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            log.info("after out of memory: %s", self.memory_summary())

    def memory_summary(self) -> str:
        if self.device.type != "cuda":
            return "CPU"
        mib = 1 << 20
        return (f"allocated {torch.cuda.memory_allocated(self.device) // mib} MiB, "
                f"reserved {torch.cuda.memory_reserved(self.device) // mib} MiB")
