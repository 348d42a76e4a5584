"""A simulated CUDA device for tests on the CPU (``worker.device.device.Accelerator``).

* **Memory**: a caching allocator with a capacity. ``alloc`` past it raises
  ``torch.OutOfMemoryError``, as the real one does; freed blocks stay reserved
  (cached) until ``empty_cache``; ``mem_get_info`` reports capacity minus what is
  reserved and what "other processes" hold (``external_bytes``). A tensor that
  ``copy_in`` puts "on the device" holds its bytes until it is garbage.
* **Streams and events**: every copy, event record, stream wait, kernel and
  ``empty_cache`` is appended to ``log`` in the order issued. A copy is
  asynchronous: it runs only when an event recorded after it is synchronised or
  waited on by a stream (or on ``synchronize``), reading its pinned buffer then.
* **Cross-stream lifetimes**: each device block is tagged with the stream it was
  allocated on and the streams whose kernels read it. A block freed while another
  stream used it, with no ``record_stream`` for that stream, goes back to its
  stream's pool at once, as CUDA's caching allocator does: the next copy on that
  stream reuses it before the reader has passed, and that is a hazard.
  A copy whose buffer was refilled before it ran, or a kernel that reads a batch
  whose copy has not run, is recorded in ``hazards``: a test asserts it is empty.

* **Downloads**: ``download_async`` is a ``non_blocking`` device-to-host copy; its
  host tensor holds NaN until its stream is synchronised (``SimStream.synchronize``,
  an event after it, or ``synchronize``).

Tensors stay on the CPU; a test handler calls ``kernel`` in its forward pass
to say it computes (on the current stream) and how much memory it needs.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

MIB = 1 << 20


@dataclass
class SimCopy:
    seq: int
    index: int  # its place among its stream's copies
    host: torch.Tensor
    snapshot: torch.Tensor
    dev: torch.Tensor


@dataclass(eq=False)
class SimStream:
    sim: SimCuda
    name: str

    def wait_event(self, event: SimEvent) -> None:
        self.sim.note("wait", self.name, event.id)
        event.complete()

    def synchronize(self) -> None:
        """Block the host until this stream's work is done: its downloads land."""
        self.sim.note("stream_sync", self.name)
        self.sim.land(self.name)


@dataclass(eq=False)
class SimEvent:
    sim: SimCuda
    id: int
    stream: SimStream | None = None
    upto: int = 0  # copies of ``stream`` issued before the record
    at: int = 0  # the record's place in the log: the simulated clock

    def record(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else self.sim.current()
        self.upto = self.sim.issued(self.stream)
        self.at = self.sim.note("record", self.stream.name, self.id)

    def elapsed_time(self, end: SimEvent) -> float:
        """Log entries between the two records (CUDA's: milliseconds)."""
        return float(end.at - self.at)

    def complete(self) -> None:
        if self.stream is not None:
            self.sim.run_copies(self.stream, self.upto)
            self.sim.land(self.stream.name)

    def synchronize(self) -> None:
        self.complete()

    def query(self) -> bool:
        return self.stream is None or self.sim.issued_done(self.stream, self.upto)


class SimCuda:
    """One simulated GPU of ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int, name: str = "Simulated GPU") -> None:
        self.device = torch.device("cpu")
        self._name = name
        self.capacity_bytes = capacity_bytes
        self.external_bytes = 0
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.log: list[tuple[Any, ...]] = []
        self.hazards: list[str] = []
        self._lock = threading.RLock()
        self._local = threading.local()
        self._ids = itertools.count(1)
        self._copies = itertools.count(1)
        #: Per stream: copies issued so far, and those not run yet.
        self._count: dict[int, int] = {}
        self._pending: dict[int, list[SimCopy]] = {}
        #: Device tensors (by data_ptr) whose copy has not run yet.
        self._unwritten: dict[int, SimCopy] = {}
        self._tags: dict[int, int] = {}
        #: Per live device block (data_ptr): its stream, the streams that read it and
        #: those ``record_stream`` told of.
        self._blocks: dict[int, tuple[SimStream, set[str], set[str]]] = {}
        #: Per stream name: blocks freed while another stream may still read them.
        self._unsafe_free: dict[str, list[str]] = {}
        self.default_stream = SimStream(self, "default")
        self._streams: dict[int, SimStream] = {id(self.default_stream): self.default_stream}
        self._stream_names = itertools.count(1)
        #: Per stream name: non_blocking downloads (host tensor, its value) not landed.
        self._landing: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        #: Called as each copy is issued (a test holds a staging thread there).
        self.copy_hook: Callable[[], None] | None = None

    # -- bookkeeping -------------------------------------------------------------------
    def note(self, *entry: Any) -> int:
        """Append to the log; the entry's place in it."""
        with self._lock:
            self.log.append(entry)
            return len(self.log) - 1

    def ops(self, kind: str) -> list[tuple[Any, ...]]:
        """The log entries of one kind (``h2d``, ``kernel``, ``oom``, ...), in order."""
        with self._lock:
            return [e for e in self.log if e[0] == kind]

    def current(self) -> SimStream:
        stream: SimStream = getattr(self._local, "stream", self.default_stream)
        return stream

    def issued(self, stream: SimStream) -> int:
        return self._count.get(id(stream), 0)

    def issued_done(self, stream: SimStream, upto: int) -> bool:
        return all(c.index >= upto for c in self._pending.get(id(stream), []))

    def run_copies(self, stream: SimStream, upto: int) -> None:
        """Run the copies issued on ``stream`` before its ``upto``-th, in order."""
        with self._lock:
            pending = self._pending.get(id(stream), [])
            for copy in [c for c in pending if c.index < upto]:
                if not torch.equal(copy.host, copy.snapshot):
                    self.hazards.append(f"copy {copy.seq}: its pinned buffer was refilled "
                                        "before the copy ran")
                with torch.inference_mode():  # the device writes it, whatever Python's mode
                    copy.dev.copy_(copy.host)
                self._unwritten.pop(copy.dev.data_ptr(), None)
                pending.remove(copy)

    # -- memory ------------------------------------------------------------------------
    def alloc(self, nbytes: int, what: str = "") -> None:
        with self._lock:
            grow = self.allocated_bytes + nbytes - self.reserved_bytes
            if grow > 0:
                if self.reserved_bytes + grow + self.external_bytes > self.capacity_bytes:
                    self.log.append(("oom", what, nbytes))
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate {nbytes / MIB:.2f} MiB "
                        f"(simulated: {self.capacity_bytes / MIB:.0f} MiB in all)")
                self.reserved_bytes += grow
            self.allocated_bytes += nbytes

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.allocated_bytes -= nbytes

    # -- the Accelerator interface -----------------------------------------------------
    def name(self) -> str:
        return self._name

    def mem_get_info(self) -> tuple[int, int]:
        with self._lock:
            free = self.capacity_bytes - self.reserved_bytes - self.external_bytes
            return max(0, free), self.capacity_bytes

    def allocator(self) -> tuple[int, int]:
        return self.allocated_bytes, self.reserved_bytes

    def empty_cache(self) -> None:
        with self._lock:
            self.reserved_bytes = self.allocated_bytes
            self.log.append(("empty_cache",))

    def synchronize(self) -> None:
        with self._lock:
            for stream in list(self._streams.values()):
                self.run_copies(stream, self.issued(stream))
                self.land(stream.name)

    def land(self, stream_name: str) -> None:
        """The downloads issued on a stream arrive in their host tensors."""
        with self._lock, torch.inference_mode():
            for host, value in self._landing.pop(stream_name, []):
                host.copy_(value)

    def download_async(self, t: torch.Tensor) -> torch.Tensor:
        """``t.to("cpu", non_blocking=True)`` on the current stream: the host tensor
        holds NaN until that stream is synchronised (or an event after it is)."""
        host = torch.full_like(t, float("nan"))
        with self._lock:
            self._landing.setdefault(self.current().name, []).append((host, t.clone()))
        return host

    def new_stream(self) -> SimStream:
        stream = SimStream(self, f"s{next(self._stream_names)}")
        with self._lock:
            self._streams[id(stream)] = stream
        return stream

    def new_event(self, timing: bool = False) -> SimEvent:
        return SimEvent(self, next(self._ids))

    @contextlib.contextmanager
    def use_stream(self, stream: Any) -> Iterator[None]:
        before = self.current()
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = before

    def pinned(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.shape, dtype=like.dtype)

    def copy_in(self, host: torch.Tensor) -> torch.Tensor:
        if self.copy_hook is not None:
            self.copy_hook()
        nbytes = host.numel() * host.element_size()
        self.alloc(nbytes, "copy")
        dev = torch.empty_like(host)
        stream = self.current()
        weakref.finalize(dev, self._freed, dev.data_ptr(), nbytes)
        with self._lock:
            for unsafe in self._unsafe_free.pop(stream.name, []):
                self.hazards.append(f"copy on {stream.name} reuses {unsafe}")
            self._blocks[dev.data_ptr()] = (stream, set(), set())
            index = self._count.get(id(stream), 0)
            self._count[id(stream)] = index + 1
            copy = SimCopy(next(self._copies), index, host, host.clone(), dev)
            self._pending.setdefault(id(stream), []).append(copy)
            self._streams.setdefault(id(stream), stream)
            self._unwritten[dev.data_ptr()] = copy
            self._tags[dev.data_ptr()] = copy.seq
            self.log.append(("h2d", stream.name, copy.seq, len(host)))
        return dev

    def _freed(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            block = self._blocks.pop(ptr, None)
            if block is not None:
                home, readers, recorded = block
                missing = readers - recorded - {home.name}
                if missing:
                    self._unsafe_free.setdefault(home.name, []).append(
                        f"a block {', '.join(sorted(missing))} may still read "
                        "(no record_stream)")
        self.free(nbytes)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        with self._lock:
            block = self._blocks.get(t.data_ptr())
            if block is not None:
                block[2].add(stream.name)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t

    # -- what a test handler calls -----------------------------------------------------
    def kernel(self, name: str, batch: torch.Tensor, bytes_per_item: int = 0) -> None:
        """A kernel on the current stream reading ``batch``, needing ``bytes_per_item``
        of scratch memory per row (raises out of memory like a real one)."""
        stream = self.current()
        with self._lock:
            copy = self._unwritten.get(batch.data_ptr())
            if copy is not None:
                self.hazards.append(f"kernel {name} on {stream.name} read copy {copy.seq} "
                                    "before it ran")
            tag = self._tags.get(batch.data_ptr())
            block = self._blocks.get(batch.data_ptr())
            if block is not None:
                block[1].add(stream.name)
        scratch = bytes_per_item * len(batch)
        self.alloc(scratch, f"{name}:{len(batch)}")
        self.note("kernel", stream.name, name, len(batch), tag)
        self.free(scratch)


#: Floats per item of ``SimHandler``'s batches.
ITEM_FLOATS = 4


class SimHandler:
    """y = 2x + 1 on a ``SimCuda``: its forward pass is one kernel needing
    ``bytes_per_item`` of device memory per row; ``fail_over`` makes batches larger
    than it raise ``failure`` instead (an allocation failure of cuBLAS, say)."""

    def __init__(self, sim: SimCuda, spec: Any, bytes_per_item: int = 0) -> None:
        self.sim = sim
        self.spec = spec
        self.bytes_per_item = bytes_per_item
        self.fail_over: int | None = None
        self.failure: Exception = RuntimeError("unset")
        #: When set, the first forward pass waits for it (bounded); whether it came
        #: in time is appended to ``gate_opened``, for the test to assert.
        self.gate: threading.Event | None = None
        self.gate_opened: list[bool] = []

    def load(self) -> None:
        return None

    def preprocess(self, job_input: Any) -> torch.Tensor:
        return torch.full((ITEM_FLOATS,), float(job_input["x"]))

    def example(self, bin_spec: Any) -> torch.Tensor:
        return torch.zeros(ITEM_FLOATS)

    def collate(self, items: Any, bin_spec: Any) -> torch.Tensor:
        return torch.stack(list(items))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if self.gate is not None and not self.gate_opened:
            self.gate_opened.append(self.gate.wait(GATE_TIMEOUT_S))
        if self.fail_over is not None and len(batch) > self.fail_over:
            self.sim.note("failed", len(batch))
            raise self.failure
        self.sim.kernel("forward", batch, self.bytes_per_item)
        return batch[:, 0] * 2 + 1

    def postprocess(self, output: torch.Tensor, n: int) -> list[Any]:
        return [{"y": float(v)} for v in output]


#: How long a gated forward pass waits for the test to open the gate; the test
#: fails (on ``gate_opened``) when it has to wait that long.
GATE_TIMEOUT_S = 5.0
