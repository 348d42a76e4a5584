"""The torch executor: the pipeline of ``worker.executors.pipelined`` on a device.

On the loop's thread, ``submit`` preprocesses a batch (a thread pool: Pillow and
the tokenizer release the GIL), collates it into the bin's shape and starts its
copy to the device (``staging``). The forward pass, the copy back and
postprocessing run on one compute thread, in ``torch.inference_mode`` and, on a
GPU, on a compute stream that waits for the copy's event. So while batch N
computes, the loop claims, preprocesses and copies batch N+1.

A failing forward pass is split in halves (``runner.isolate``): an input that
breaks the model fails alone, and an out-of-memory error frees the allocator's
cache, caps the bin in the memory guard and retries the halves.

On a GPU, ``cudnn.benchmark`` is on and each batch is padded up to a rung of
``worker.executors.ladder`` (repeating its last item; the extra rows are cut from the
output before postprocessing), so cuDNN autotunes only the sizes that warm-up
ran, never on the serving path.

The device is an ``Accelerator`` (``worker.device.device``): CUDA, or in tests a
simulated device; None on the CPU.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from carpool.core.catalogue import BinSpec
from carpool.core.settings import ExecutorSettings
from worker.device.device import Accelerator, Event, accelerator_for
from worker.device.memory import MemoryGuard
from worker.device.tensor_tree import map_tensors
from worker.executors.ladder import padded, snap_down
from worker.executors.pipelined import PipelinedExecutor
from worker.executors.staging import Staged, Staging, to_host
from worker.handlers.base import ModelHandler

log = logging.getLogger(__name__)

__all__ = ["Padded", "TorchExecutor", "memory_guard"]


def memory_guard(settings: ExecutorSettings, gpu: Accelerator | None) -> MemoryGuard:
    """A guard reading this device's memory; on the CPU, one that only OOMs drive."""
    if gpu is None:
        return MemoryGuard(None)
    return MemoryGuard(gpu.mem_get_info, gpu.allocator,
                       watermark_fraction=settings.free_watermark,
                       empty_cache=gpu.empty_cache,
                       empty_cache_every=settings.empty_cache_every)


@dataclass
class Padded:
    """A staged batch padded from ``rows`` items up to a rung of the ladder."""

    staged: Staged
    rows: int
    to: int


def pad_rows(t: torch.Tensor, rows: int, to: int) -> torch.Tensor:
    """``t`` (``rows`` items along dim 0) grown to ``to`` rows by repeating its last."""
    if t.dim() == 0 or len(t) != rows or to <= rows:
        return t
    return torch.cat([t, t[-1:].expand(to - rows, *t.shape[1:])])


class TorchExecutor(PipelinedExecutor):
    """Runs batches of torch handlers on one device, ``depth`` in flight."""

    def __init__(self, settings: ExecutorSettings, device: str | Accelerator,
                 guard: MemoryGuard | None = None) -> None:
        self.gpu = accelerator_for(device) if isinstance(device, str) else device
        self.device = self.gpu.device if self.gpu is not None else torch.device(str(device))
        super().__init__(settings.pipeline_depth, settings.preprocess_threads,
                         guard or memory_guard(settings, self.gpu))
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # sizes are padded to warmed-up rungs
        #: Pad batches to ladder rungs (on a GPU: what cuDNN's autotuning needs).
        self.pad_batches = self.gpu is not None
        self.staging = Staging(self.gpu)
        self.compute_stream: Any = self.gpu.new_stream() if self.gpu is not None else None
        #: When a list (tests, profiling): events "copy_start", "copy_end",
        #: "compute_start", "compute_end" of every batch, in the order recorded.
        self.trace: list[tuple[str, Event]] | None = None

    def _mark(self, name: str, stream: Any) -> None:
        if self.trace is not None and stream is not None and self.gpu is not None:
            event = self.gpu.new_event(timing=True)
            event.record(stream)
            self.trace.append((name, event))

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        """The guard's limit snapped down to a rung of the ladder (on a GPU): a cap
        between rungs (growth in steps of 1/8, half-way ceilings) would claim, and
        run, a size that warm-up never ran."""
        return self._snapped(self.guard.limit((model, bin_name), max_batch), max_batch)

    def view_limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return self._snapped(self.guard.view((model, bin_name), max_batch), max_batch)

    def _snapped(self, n: int, max_batch: int) -> int:
        return snap_down(n, max_batch) if self.pad_batches else n

    def rows_for(self, handler: ModelHandler, bin_spec: BinSpec, n: int) -> int:
        """How many rows a batch of ``n`` runs as: its rung, within the bin's cap
        (itself snapped down to a rung)."""
        if not self.pad_batches:
            return n
        cap = self.guard.cap((handler.spec.name, bin_spec.name)) or bin_spec.max_batch
        cap = snap_down(min(cap, bin_spec.max_batch), bin_spec.max_batch)
        rung = padded(n, bin_spec.max_batch)
        return min(rung, cap) if cap >= n else n

    def stage(self, handler: ModelHandler, items: Any, bin_spec: BinSpec) -> Any:
        batch = self.collate(handler, items, bin_spec)
        n, rows = len(items), self.rows_for(handler, bin_spec, len(items))
        if rows == n:
            return self.to_device(batch)
        grown = map_tensors(batch, lambda _, t: pad_rows(t, n, rows))
        return Padded(self.to_device(grown), n, rows)

    def to_device(self, batch: Any) -> Staged:
        self._mark("copy_start", self.staging.copy_stream)
        staged = self.staging.to_device(batch)
        self._mark("copy_end", self.staging.copy_stream)
        return staged

    def forward(self, handler: ModelHandler, staged: Staged | Padded) -> Any:
        """Forward pass on the compute stream; the output back on the host, cut to
        the batch's real rows if it was padded."""
        if isinstance(staged, Padded):
            out = self.forward(handler, staged.staged)
            return map_tensors(out, lambda _, t: t[: staged.rows]
                               if t.dim() and len(t) == staged.to else t)
        if self.gpu is None or self.compute_stream is None:
            return to_host(handler.forward(staged.batch))
        with self.gpu.use_stream(self.compute_stream):
            batch = self.staging.enter_compute(staged, self.compute_stream)
            self._mark("compute_start", self.compute_stream)
            output = handler.forward(batch)
            self._mark("compute_end", self.compute_stream)
            # A handler may return a non_blocking device-to-host copy: a CPU tensor that
            # is still being written. The stream is done before any host read of it.
            self.compute_stream.synchronize()
            return to_host(output, self.gpu)

    def inference_context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.inference_mode()

    def release(self) -> None:
        if self.gpu is not None:
            self.gpu.empty_cache()
            log.info("device memory released: %s", self.memory_summary())

    def synchronize(self) -> None:
        """Wait for the device (calibration's timings); nothing on the CPU."""
        if self.gpu is not None:
            self.gpu.synchronize()

    def memory_summary(self) -> str:
        if self.gpu is None:
            return "CPU"
        mib = 1 << 20
        allocated, reserved = self.gpu.allocator()
        return f"allocated {allocated // mib} MiB, reserved {reserved // mib} MiB"
