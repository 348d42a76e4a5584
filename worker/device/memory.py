"""The memory guard: a per-bin batch cap that follows free device memory and
remembers the sizes that ran out of it.

Before each claim the executor asks ``limit(bin, max_batch)``: the claim takes
the smaller of the scheduler's ``max_batch`` and the guard's own cap, and the
guard never stores the scheduler's number (a claim cut short by a deadline says
nothing about memory). The guard's cap has three parts; the smallest wins:

* **Free memory** (``torch.cuda.mem_get_info`` on a GPU; any reader in tests):
  below the watermark the bin's cap halves, and once memory has recovered it
  grows back one step per batch (multiplicative decrease, additive increase:
  shrinking is urgent, growing is a bet).
* **Out of memory at n**: a learned ceiling below n — the largest batch that
  ran cleanly below n, else n / 2. The ceiling is raised only after
  ``CLEAN_BATCHES`` clean batches in a row with free memory above the high
  watermark (``RECOVERY_FACTOR`` × the watermark), half way towards the size
  that failed; each time a raised ceiling fails again the number of clean
  batches it needs doubles (up to ``MAX_CLEAN_BATCHES``). A device that fits
  48 of 64 thus settles at 48 and tries more ever more rarely.
* **Calibration**: the largest batch its probe ran (``set_ceiling``); fixed.

``empty_cache`` runs every ``empty_cache_every`` batches, called by the executor
between batches only.

Memory that this process's caching allocator holds but does not use (reserved
minus allocated) counts as free here: torch reuses it before asking the device
for more, although ``mem_get_info`` reports it as taken.

Every value a metrics exporter needs is a plain attribute: ``shrinks_total``,
``limits`` (each capped bin's cap, all parts applied), ``free_bytes``,
``used_bytes``, ``reserved_bytes``, ``allocated_bytes``.
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
#: A limit grows back by this fraction of its top per healthy batch (at least 1).
GROWTH_FRACTION = 1 / 8
#: Clean batches in a row, memory recovered, before a learned ceiling is raised.
CLEAN_BATCHES = 16
#: The most clean batches a ceiling that keeps failing waits for (doubling up to it).
MAX_CLEAN_BATCHES = 4096


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


@dataclass
class Learned:
    """What one bin's out-of-memory errors taught: never above ``ceiling`` for now."""

    ceiling: int
    failed_at: int  # the last size that ran out of memory
    needed: int = CLEAN_BATCHES  # clean batches before the next raise
    clean: int = 0  # clean batches in a row so far
    largest_ok: int = 0  # largest batch that ran cleanly since the last failure
    raised: bool = False  # the ceiling was raised since the last failure


class MemoryGuard:
    """Per-bin batch caps driven by free memory and out-of-memory errors; thread-safe."""

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
        #: Each capped bin's cap now, every part applied (absent: uncapped).
        self.limits: dict[BinKey, int] = {}
        #: The largest batch known to fit (calibration); never exceeded.
        self.ceilings: dict[BinKey, int] = {}
        #: The free-memory part of each bin's cap (absent: uncapped).
        self.memory_caps: dict[BinKey, int] = {}
        #: The out-of-memory part.
        self.learned: dict[BinKey, Learned] = {}
        #: The largest max_batch asked for per bin: what a cap grows back towards.
        self._tops: dict[BinKey, int] = {}
        self.shrinks_total = 0
        self.shrinks: dict[BinKey, int] = {}
        self.out_of_memory_total = 0
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

    def recovered(self, reading: MemoryReading | None) -> bool:
        """Free memory above the high watermark (always, without a reader)."""
        if reading is None:
            return True
        return reading.available_bytes >= (RECOVERY_FACTOR * self.watermark_fraction
                                           * reading.total_bytes)

    def set_ceiling(self, key: BinKey, largest_fit: int) -> None:
        """Never run more than ``largest_fit`` jobs of this bin at once."""
        with self._lock:
            self.ceilings[key] = max(1, largest_fit)
            self._publish(key)

    def cap(self, key: BinKey) -> int | None:
        """The guard's own cap on this bin's batches (None: uncapped)."""
        return self.limits.get(key)

    def view(self, key: BinKey, max_batch: int) -> int:
        """What ``limit`` would answer from the caps as they stand, read-only: no
        memory reading, no shrink or growth. For observers (metrics scrapes,
        ``celery inspect stats``, Flower), which run at any rate: were they to call
        ``limit``, each scrape during a dip would halve a cap again."""
        cap = self.limits.get(key)
        return max_batch if cap is None else max(1, min(max_batch, cap))

    def limit(self, key: BinKey, max_batch: int) -> int:
        """How many jobs of this bin the next claim may take: ``max_batch`` (the
        scheduler's cap for this claim) or the guard's cap, whichever is smaller.
        It reads memory and moves the caps: call it for claims only (``view``
        for the rest)."""
        reading = self.read()
        with self._lock:
            top = self._tops[key] = max(self._tops.get(key, 0), max_batch)
            current = self.memory_caps.get(key, top)
            if reading is not None:
                watermark = self.watermark_fraction * reading.total_bytes
                if reading.available_bytes < watermark and current > 1:
                    current = self._shrink(key, max(1, current // 2), reading,
                                           "free memory below the watermark")
                elif self.recovered(reading) and current < top:
                    current = min(top, current + max(1, int(top * GROWTH_FRACTION)))
                    log.info("%s/%s memory cap -> %d: memory recovered", *key, current)
            if current >= top:
                self.memory_caps.pop(key, None)
            else:
                self.memory_caps[key] = current
            cap = self._publish(key)
        return max_batch if cap is None else max(1, min(max_batch, cap))

    def on_out_of_memory(self, key: BinKey, batch_size: int) -> None:
        """A batch of ``batch_size`` ran out of memory: cap this bin below it, at the
        largest size that ran cleanly below it, else at half of it."""
        with self._lock:
            self.out_of_memory_total += 1
            old = self.learned.get(key)
            largest_ok = old.largest_ok if old is not None else 0
            ceiling = largest_ok if 0 < largest_ok < batch_size else max(1, batch_size // 2)
            cap = self.limits.get(key)
            if cap is not None and cap < batch_size:
                ceiling = min(ceiling, cap)  # it failed below the cap: memory got tighter
            needed = old.needed if old is not None else CLEAN_BATCHES
            if old is not None and old.raised:
                needed = min(MAX_CLEAN_BATCHES, old.needed * 2)  # a raise failed again
            self.learned[key] = Learned(ceiling, batch_size, needed, 0, largest_ok
                                        if largest_ok < batch_size else 0)
            self._shrink(key, ceiling, self.last, f"out of memory at batch {batch_size}")
            self._publish(key)

    def after_batch(self, key: BinKey | None = None, ran: int = 0,
                    out_of_memory: bool = False) -> None:
        """Count a batch of ``key`` whose largest clean (sub-)batch was ``ran``; raise
        a learned ceiling after enough clean ones; empty the allocator's cache every
        ``empty_cache_every`` batches."""
        with self._lock:
            self.batches += 1
            due = self.empty_cache_every and self.batches % self.empty_cache_every == 0
            if key is not None:
                self._learn(key, ran, out_of_memory)
        if due and self._empty_cache is not None:
            self._empty_cache()
            self.empty_cache_calls += 1
            log.debug("emptied the CUDA cache after %d batches", self.batches)

    def _learn(self, key: BinKey, ran: int, out_of_memory: bool) -> None:
        learned = self.learned.get(key)
        if learned is None:
            return
        learned.largest_ok = max(learned.largest_ok, ran)
        if out_of_memory or not self.recovered(self.last):
            learned.clean = 0
            return
        learned.clean += 1
        if learned.clean < learned.needed:
            return
        learned.clean = 0
        learned.raised = True
        top = self._tops.get(key, learned.failed_at)
        # Half way towards the size that failed; at the edge, that size itself.
        learned.ceiling = max(learned.ceiling + 1,
                              (learned.ceiling + learned.failed_at) // 2)
        if learned.ceiling >= top:
            del self.learned[key]
            log.info("%s/%s: no out-of-memory ceiling any more", *key)
        else:
            log.info("%s/%s out-of-memory ceiling -> %d after %d clean batches",
                     key[0], key[1], learned.ceiling, learned.needed)
        self._publish(key)

    def _publish(self, key: BinKey) -> int | None:
        parts = [self.memory_caps.get(key), self.ceilings.get(key),
                 self.learned[key].ceiling if key in self.learned else None]
        caps = [p for p in parts if p is not None]
        if not caps:
            self.limits.pop(key, None)
            return None
        self.limits[key] = min(caps)
        return self.limits[key]

    def _shrink(self, key: BinKey, new: int, reading: MemoryReading | None, why: str) -> int:
        self.shrinks_total += 1
        self.shrinks[key] = self.shrinks.get(key, 0) + 1
        if self.on_shrink is not None:
            self.on_shrink(*key)
        log.warning("%s/%s batch limit -> %d: %s (%s)", key[0], key[1], new, why,
                    describe(reading))
        return new


def describe(reading: MemoryReading | None) -> str:
    """A log fragment: free vs total, reserved vs allocated, in MiB."""
    if reading is None:
        return "no memory reading"
    mib = 1 << 20
    return (f"free {reading.free_bytes // mib} of {reading.total_bytes // mib} MiB, "
            f"reserved {reading.reserved_bytes // mib} MiB, "
            f"allocated {reading.allocated_bytes // mib} MiB")
