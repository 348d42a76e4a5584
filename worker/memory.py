"""The memory guard: a per-bin batch limit that follows free device memory.

Before each batch the executor asks ``limit(bin, max_batch)``. The guard reads
free memory (``torch.cuda.mem_get_info`` on a GPU; any reader in tests): below
the watermark it halves that bin's limit, and once memory has recovered it grows
the limit back one step per batch (multiplicative decrease, additive increase:
shrinking is urgent, growing is a bet). An out-of-memory error halves the limit
of its bin at once. ``empty_cache`` runs every ``empty_cache_every`` batches,
called by the executor between batches only.

Memory that this process's caching allocator holds but does not use (reserved
minus allocated) counts as free here: torch reuses it before asking the device
for more, although ``mem_get_info`` reports it as taken.

Every value a metrics exporter needs is a plain attribute: ``shrinks_total``,
``limits``, ``free_bytes``, ``used_bytes``, ``reserved_bytes``,
``allocated_bytes``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: (free bytes, total bytes) of the device, like ``torch.cuda.mem_get_info``.
FreeReader = Callable[[], tuple[int, int]]
#: (allocated bytes, reserved bytes) of this process's caching allocator.
AllocatorReader = Callable[[], tuple[int, int]]
BinKey = tuple[str, str]  # (model, bin)

#: Memory has "recovered" only above this multiple of the watermark, so a limit
#: does not flap between halving and growing at the boundary.
RECOVERY_FACTOR = 1.5
#: A limit grows back by this fraction of its ceiling per healthy batch (at least 1).
GROWTH_FRACTION = 1 / 8


@dataclass(frozen=True)
class MemoryReading:
    free_bytes: int
    total_bytes: int
    allocated_bytes: int
    reserved_bytes: int

    @property
    def available_bytes(self) -> int:
        """Free on the device plus what our allocator caches but does not use."""
        return self.free_bytes + max(0, self.reserved_bytes - self.allocated_bytes)


class MemoryGuard:
    """Per-bin batch limits driven by free memory; thread-safe."""

    def __init__(
        self,
        read_free: FreeReader | None,
        read_allocator: AllocatorReader | None = None,
        *,
        watermark_fraction: float = 0.10,
        empty_cache: Callable[[], None] | None = None,
        empty_cache_every: int = 0,
    ) -> None:
        self._read_free = read_free
        self._read_allocator = read_allocator
        self.watermark_fraction = watermark_fraction
        self._empty_cache = empty_cache
        self.empty_cache_every = empty_cache_every
        self._lock = threading.Lock()
        #: The batch limit each bin has now (absent: its configured max_batch).
        self.limits: dict[BinKey, int] = {}
        #: The largest batch known to fit (calibration); never exceeded.
        self.ceilings: dict[BinKey, int] = {}
        self.shrinks_total = 0
        self.shrinks: dict[BinKey, int] = {}
        self.empty_cache_calls = 0
        self.batches = 0
        self.last: MemoryReading | None = None
        #: Told (model, bin) of every shrink: the worker's metrics count them here.
        self.on_shrink: Callable[[str, str], None] | None = None

    # -- the figures a metrics exporter reads ------------------------------------------
    @property
    def free_bytes(self) -> int:
        return self.last.free_bytes if self.last else 0

    @property
    def used_bytes(self) -> int:
        return self.last.total_bytes - self.last.free_bytes if self.last else 0

    @property
    def reserved_bytes(self) -> int:
        return self.last.reserved_bytes if self.last else 0

    @property
    def allocated_bytes(self) -> int:
        return self.last.allocated_bytes if self.last else 0

    # -- decisions ---------------------------------------------------------------------
    def read(self) -> MemoryReading | None:
        if self._read_free is None:
            return None
        free, total = self._read_free()
        allocated, reserved = self._read_allocator() if self._read_allocator else (0, 0)
        reading = MemoryReading(free, total, allocated, reserved)
        self.last = reading
        return reading

    def set_ceiling(self, key: BinKey, largest_fit: int) -> None:
        """Never run more than ``largest_fit`` jobs of this bin at once."""
        with self._lock:
            self.ceilings[key] = max(1, largest_fit)

    def limit(self, key: BinKey, max_batch: int) -> int:
        """How many jobs of this bin the next batch may take, after a memory check."""
        top = min(max_batch, self.ceilings.get(key, max_batch))
        reading = self.read()
        with self._lock:
            current = min(self.limits.get(key, top), top)
            if reading is None:
                current = self._grow(key, current, top)  # no reader: only OOMs shrink it
            else:
                watermark = self.watermark_fraction * reading.total_bytes
                if reading.available_bytes < watermark and current > 1:
                    current = self._shrink(key, max(1, current // 2), reading,
                                           "free memory below the watermark")
                elif reading.available_bytes >= RECOVERY_FACTOR * watermark:
                    current = self._grow(key, current, top)
            self.limits[key] = current
            return current

    def on_out_of_memory(self, key: BinKey, batch_size: int) -> None:
        """A batch of ``batch_size`` ran out of memory: halve this bin's limit below it."""
        with self._lock:
            current = min(self.limits.get(key, batch_size), batch_size)
            self.limits[key] = self._shrink(key, max(1, current // 2), self.last,
                                            f"out of memory at batch {batch_size}")

    def after_batch(self) -> None:
        """Count a batch; empty the allocator's cache every ``empty_cache_every``."""
        with self._lock:
            self.batches += 1
            due = self.empty_cache_every and self.batches % self.empty_cache_every == 0
        if due and self._empty_cache is not None:
            self._empty_cache()
            self.empty_cache_calls += 1
            log.debug("emptied the CUDA cache after %d batches", self.batches)

    def _shrink(self, key: BinKey, new: int, reading: MemoryReading | None, why: str) -> int:
        self.shrinks_total += 1
        self.shrinks[key] = self.shrinks.get(key, 0) + 1
        if self.on_shrink is not None:
            self.on_shrink(*key)
        log.warning("%s/%s batch limit -> %d: %s (%s)", key[0], key[1], new, why,
                    describe(reading))
        return new

    def _grow(self, key: BinKey, current: int, top: int) -> int:
        if current >= top:
            return top
        new = min(top, current + max(1, int(top * GROWTH_FRACTION)))
        log.info("%s/%s batch limit -> %d: memory recovered", key[0], key[1], new)
        return new


def describe(reading: MemoryReading | None) -> str:
    """A log fragment: free vs total, reserved vs allocated, in MiB."""
    if reading is None:
        return "no memory reading"
    mib = 1 << 20
    return (f"free {reading.free_bytes // mib} of {reading.total_bytes // mib} MiB, "
            f"reserved {reading.reserved_bytes // mib} MiB, "
            f"allocated {reading.allocated_bytes // mib} MiB")
