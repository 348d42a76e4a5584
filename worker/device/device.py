"""The CUDA calls the executor, staging, memory guard and calibration make, behind
one small interface.

``CudaDevice`` is ``torch.cuda`` on one device. Tests pass a simulated device
(``tests/support/simcuda.py``) with the same methods: an allocator with a capacity, a
``mem_get_info`` that reflects what is held, and streams and events that record
the order of copies, waits and kernels, so the GPU path runs, and is checked, on
a machine without a GPU. On the CPU there is no accelerator at all (``None``):
no streams, no pinning, no copies.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch


class Event(Protocol):
    def record(self, stream: Any = None) -> None:
        """Mark the point in ``stream`` that the event completes at."""

    def synchronize(self) -> None:
        """Block the host until the work before the record is done."""


class Accelerator(Protocol):
    """One CUDA device, as the GPU path of the worker uses it."""

    #: Where tensors go: ``cuda:N``; a simulated device keeps them on the CPU.
    device: torch.device

    def name(self) -> str:
        """The device's name, as calibration profiles record it."""

    def mem_get_info(self) -> tuple[int, int]:
        """(free bytes, total bytes) on the device."""

    def allocator(self) -> tuple[int, int]:
        """(allocated bytes, reserved bytes) of this process's caching allocator."""

    def empty_cache(self) -> None:
        """Hand the allocator's unused cached blocks back to the device."""

    def synchronize(self) -> None:
        """Wait for all work on the device."""

    def new_stream(self) -> Any:
        """A new stream (``wait_event`` and ``synchronize`` are all the worker calls
        on it)."""

    def new_event(self, timing: bool = False) -> Event:
        """A new event; ``timing`` events also give ``elapsed_time``."""

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``stream`` current on this thread for the block."""

    def pinned(self, like: torch.Tensor) -> torch.Tensor:
        """A page-locked host buffer of ``like``'s shape and dtype."""

    def copy_in(self, host: torch.Tensor) -> torch.Tensor:
        """An asynchronous copy of ``host`` to the device on the current stream."""

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        """Tell the allocator that ``stream`` uses ``t`` (not reused before it is past)."""

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the CPU (waits for the stream that made it)."""


class CudaDevice:
    """``torch.cuda`` on one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def name(self) -> str:
        return torch.cuda.get_device_name(self.device)

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.device)

    def allocator(self) -> tuple[int, int]:
        return torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def new_stream(self) -> Any:
        return torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def new_event(self, timing: bool = False) -> Event:
        event: Event = torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]
        return event

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def pinned(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)

    def copy_in(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t.cpu() if t.device.type != "cpu" else t


def accelerator_for(device: str) -> Accelerator | None:
    """The accelerator a device name means: CUDA for ``cuda``/``cuda:N``, else None."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return CudaDevice(dev)
