"""Host → device copies of collated batches, and device → host for results.

On a GPU a batch is copied into a pinned (page-locked) host buffer and from
there to the device with ``non_blocking=True`` on a dedicated copy stream, so
the copy of batch N+1 overlaps the compute of batch N on the compute stream. An
event recorded after the copy is what the compute stream waits on.

Pinned buffers are reused: two per (tensor name, item shape, dtype) — one is
filled while the other's copy may still be in flight. Pinning memory is slow
(it is a system call that locks pages), so a buffer is allocated once for the
largest batch seen and sliced after.

Two threads stage at once: the loop's thread stages batch N+1 while the compute
thread re-stages the halves of a failed batch N. So the pool is locked, a buffer
is taken out of it while it is being filled, and each buffer carries the event
recorded right after its own copy was issued: before a buffer is filled again,
that event is awaited, so a copy still pending never reads a refilled buffer.
When every buffer of a key is taken, a new one is pinned (the pool grows to the
number of threads that stage at once, no further).

On the CPU the same calls run with no streams, no pinning and no copies.

A batch is a tensor, a dict / list / tuple of tensors, or anything else
(passed through untouched, for models such as ``synthetic``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from worker.device.device import Accelerator, Event
from worker.device.tensor_tree import map_tensors

#: Buffers per key: one being filled while the other's copy is in flight.
BUFFERS_PER_SHAPE = 2

BufferKey = tuple[str, tuple[int, ...], torch.dtype]


@dataclass
class _Slot:
    buffer: torch.Tensor
    #: Recorded on the copy stream right after this buffer's last copy was issued.
    copied: Event | None = None
    #: Taken by a thread that is filling it (not in the pool meanwhile).
    taken: bool = False


@dataclass
class _Ring:
    slots: list[_Slot] = field(default_factory=list)
    next: int = 0


@dataclass
class Staged:
    """A batch on the device; ``ready`` is the event its copy recorded (GPU only)."""

    batch: Any
    ready: Event | None = None


class Staging:
    """Moves batches to the device through reusable pinned buffers and a copy stream;
    thread-safe."""

    def __init__(self, gpu: Accelerator | None) -> None:
        self.gpu = gpu
        self.copy_stream: Any = gpu.new_stream() if gpu is not None else None
        self._rings: dict[BufferKey, _Ring] = {}
        self._lock = threading.Lock()
        #: Pinned buffers allocated so far: constant once every shape was seen.
        self.pinned_allocations = 0

    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        assert self.gpu is not None
        # Not an inference tensor, even when the compute thread (in inference_mode)
        # pins it: the loop's thread, outside that mode, refills it later.
        with torch.inference_mode(False):
            return self.gpu.pinned(t)

    def _take(self, path: str, t: torch.Tensor) -> _Slot:
        """A buffer for ``t`` that no other thread fills; the caller gives it back."""
        with self._lock:
            ring = self._rings.setdefault((path, tuple(t.shape[1:]), t.dtype), _Ring())
            free = [i for i, s in enumerate(ring.slots) if not s.taken]
            if len(ring.slots) < BUFFERS_PER_SHAPE or not free:
                slot = _Slot(self._pin(t), taken=True)
                self.pinned_allocations += 1
                ring.slots.append(slot)
                return slot
            # Round robin among the free ones: the one used longest ago is likeliest done.
            i = min(free, key=lambda j: (j - ring.next) % len(ring.slots))
            ring.next = (i + 1) % len(ring.slots)
            slot = ring.slots[i]
            slot.taken = True
        if slot.copied is not None:
            slot.copied.synchronize()  # its last copy must be done before we overwrite it
        if slot.buffer.shape[0] < len(t):
            with self._lock:
                self.pinned_allocations += 1
            slot.buffer = self._pin(t)  # a bigger batch than ever: grow once
        return slot

    def _give_back(self, slot: _Slot, copied: Event) -> None:
        with self._lock:
            slot.copied = copied
            slot.taken = False

    def to_device(self, batch: Any) -> Staged:
        """Start copying ``batch`` to the device; returns at once on a GPU."""
        gpu = self.gpu
        if gpu is None:
            return Staged(batch)

        def copy(path: str, t: torch.Tensor) -> torch.Tensor:
            slot = self._take(path, t)
            host = slot.buffer[: len(t)]
            host.copy_(t)
            with gpu.use_stream(self.copy_stream):
                # Allocated on the copy stream; the compute stream records its use.
                on_device = gpu.copy_in(host)
                copied = gpu.new_event()
                copied.record(self.copy_stream)
            self._give_back(slot, copied)
            return on_device

        on_device = map_tensors(batch, copy)
        ready = gpu.new_event()
        ready.record(self.copy_stream)
        return Staged(on_device, ready)

    def enter_compute(self, staged: Staged, stream: Any) -> Any:
        """Make ``stream`` wait for the batch's copy; the batch, usable on ``stream``."""
        gpu = self.gpu
        if staged.ready is None or stream is None or gpu is None:
            return staged.batch
        stream.wait_event(staged.ready)

        def mark(_: str, t: torch.Tensor) -> torch.Tensor:
            gpu.record_stream(t, stream)  # not reused by the allocator until stream is past it
            return t

        return map_tensors(staged.batch, mark)


def to_host(output: Any, gpu: Accelerator | None = None) -> Any:
    """``output`` with every tensor on the CPU (waits for the stream that made it)."""
    if gpu is None:
        return map_tensors(output, lambda _, t: t.cpu() if t.device.type != "cpu" else t)
    return map_tensors(output, lambda _, t: gpu.to_host(t))
