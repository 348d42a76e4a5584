"""Host → device copies of collated batches, and device → host for results.

On a GPU a batch is copied into a pinned (page-locked) host buffer and from
there to the device with ``non_blocking=True`` on a dedicated copy stream, so
the copy of batch N+1 overlaps the compute of batch N on the compute stream. An
event recorded after the copy is what the compute stream waits on.

Pinned buffers are reused: two per (tensor name, item shape, dtype) — one is
filled while the other's copy may still be in flight. Before a buffer is
refilled, the event of its previous copy is awaited. Pinning memory is slow
(it is a system call that locks pages), so a buffer is allocated once for the
largest batch seen and sliced after.

On the CPU the same calls run with no streams, no pinning and no copies.

A batch is a tensor, a dict / list / tuple of tensors, or anything else
(passed through untouched, for models such as ``synthetic``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: Buffers per key: one being filled while the other's copy is in flight.
BUFFERS_PER_SHAPE = 2

BufferKey = tuple[str, tuple[int, ...], torch.dtype]


def map_tensors(batch: Any, fn: Callable[[str, torch.Tensor], torch.Tensor],
                path: str = "") -> Any:
    """``batch`` with ``fn(path, tensor)`` applied to every tensor inside it."""
    if isinstance(batch, torch.Tensor):
        return fn(path, batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn, f"{path}.{k}") for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(map_tensors(v, fn, f"{path}[{i}]") for i, v in enumerate(batch))
    return batch


@dataclass
class _Slot:
    buffer: torch.Tensor
    copied: torch.cuda.Event | None = None


@dataclass
class _Ring:
    slots: list[_Slot] = field(default_factory=list)
    next: int = 0


@dataclass
class Staged:
    """A batch on the device; ``ready`` is the event its copy recorded (GPU only)."""

    batch: Any
    ready: torch.cuda.Event | None = None


class Staging:
    """Moves batches to ``device`` through reusable pinned buffers and a copy stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.copy_stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(device) if self.cuda else None)  # type: ignore[no-untyped-call]
        self._rings: dict[BufferKey, _Ring] = {}
        #: Pinned buffers allocated so far: constant once every shape was seen.
        self.pinned_allocations = 0

    def _alloc(self, t: torch.Tensor) -> torch.Tensor:
        self.pinned_allocations += 1
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)

    def _pinned(self, path: str, t: torch.Tensor) -> _Slot:
        ring = self._rings.setdefault((path, tuple(t.shape[1:]), t.dtype), _Ring())
        if len(ring.slots) < BUFFERS_PER_SHAPE:
            slot = _Slot(self._alloc(t))
            ring.slots.append(slot)
        else:
            slot = ring.slots[ring.next]
            if slot.copied is not None:
                slot.copied.synchronize()  # its last copy must be done before we overwrite it
            if slot.buffer.shape[0] < len(t):
                slot.buffer = self._alloc(t)  # a bigger batch than ever: grow once
        ring.next = (ring.next + 1) % BUFFERS_PER_SHAPE
        return slot

    def to_device(self, batch: Any) -> Staged:
        """Start copying ``batch`` to the device; returns at once on a GPU."""
        if not self.cuda:
            return Staged(batch)
        assert self.copy_stream is not None
        slots: list[_Slot] = []

        def copy(path: str, t: torch.Tensor) -> torch.Tensor:
            slot = self._pinned(path, t)
            host = slot.buffer[: len(t)]
            host.copy_(t)
            slots.append(slot)
            with torch.cuda.stream(self.copy_stream):
                # Allocated on the copy stream; the compute stream records its use.
                return host.to(self.device, non_blocking=True)

        on_device = map_tensors(batch, copy)
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record(self.copy_stream)
        for slot in slots:
            slot.copied = ready
        return Staged(on_device, ready)

    def enter_compute(self, staged: Staged, stream: torch.cuda.Stream | None) -> Any:
        """Make ``stream`` wait for the batch's copy; the batch, usable on ``stream``."""
        if staged.ready is None or stream is None:
            return staged.batch
        stream.wait_event(staged.ready)

        def mark(_: str, t: torch.Tensor) -> torch.Tensor:
            t.record_stream(stream)  # not reused by the allocator until stream is past it
            return t

        return map_tensors(staged.batch, mark)


def to_host(output: Any) -> Any:
    """``output`` with every tensor on the CPU (waits for the stream that made it)."""
    return map_tensors(output, lambda _, t: t.cpu() if t.device.type != "cpu" else t)
