"""The memory guard, driven by an injected memory reader: no GPU needed."""

from __future__ import annotations

from worker.device.memory import CLEAN_BATCHES, MemoryGuard

GIB = 1 << 30
KEY = ("resnet18", "fast")


class FakeDevice:
    """A device whose free memory the test sets; 10 GiB in all."""

    def __init__(self) -> None:
        self.free = 8 * GIB
        self.allocated = 0
        self.reserved = 0

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, 10 * GIB

    def allocator(self) -> tuple[int, int]:
        return self.allocated, self.reserved


def guard_for(device: FakeDevice, **kw: int) -> MemoryGuard:
    return MemoryGuard(device.mem_get_info, device.allocator, watermark_fraction=0.10, **kw)


def test_plenty_of_free_memory_leaves_the_configured_batch_limit() -> None:
    device = FakeDevice()
    guard = guard_for(device)
    assert [guard.limit(KEY, 64) for _ in range(3)] == [64, 64, 64]
    assert guard.shrinks_total == 0


def test_free_memory_below_the_watermark_halves_the_limit_each_batch_down_to_one() -> None:
    device = FakeDevice()
    guard = guard_for(device)
    device.free = GIB // 2  # 5 % of 10 GiB, under the 10 % watermark
    assert [guard.limit(KEY, 64) for _ in range(8)] == [32, 16, 8, 4, 2, 1, 1, 1]
    assert guard.shrinks_total == 6
    assert guard.limits[KEY] == 1
    assert guard.used_bytes == 10 * GIB - GIB // 2


def test_the_limit_grows_back_step_by_step_once_memory_recovers() -> None:
    device = FakeDevice()
    guard = guard_for(device)
    device.free = GIB // 2
    guard.limit(KEY, 64)
    guard.limit(KEY, 64)  # 16
    device.free = 8 * GIB
    assert [guard.limit(KEY, 64) for _ in range(7)] == [24, 32, 40, 48, 56, 64, 64]


def test_memory_just_above_the_watermark_neither_shrinks_nor_grows_the_limit() -> None:
    device = FakeDevice()
    guard = guard_for(device)
    device.free = GIB // 2
    guard.limit(KEY, 64)  # 32
    device.free = GIB + GIB // 4  # 12.5 %: above the watermark, below recovery
    assert [guard.limit(KEY, 64) for _ in range(3)] == [32, 32, 32]


def test_memory_our_allocator_caches_but_does_not_use_counts_as_free() -> None:
    device = FakeDevice()
    guard = guard_for(device)
    device.free, device.reserved, device.allocated = GIB // 2, 6 * GIB, 2 * GIB
    assert guard.limit(KEY, 64) == 64
    assert guard.reserved_bytes == 6 * GIB and guard.allocated_bytes == 2 * GIB


def test_out_of_memory_halves_the_limit_below_the_failed_batch_size() -> None:
    guard = guard_for(FakeDevice())
    guard.on_out_of_memory(KEY, 40)
    assert guard.limits[KEY] == 20
    assert guard.shrinks == {KEY: 1}


def test_without_a_memory_reader_only_out_of_memory_errors_shrink_the_limit() -> None:
    guard = MemoryGuard(None)
    assert guard.limit(KEY, 16) == 16
    guard.on_out_of_memory(KEY, 16)
    limits = []
    for _ in range(CLEAN_BATCHES + 1):
        limits.append(guard.limit(KEY, 16))
        guard.after_batch(KEY, limits[-1])
    # Not back into the size that just failed: 8 until CLEAN_BATCHES ran cleanly,
    # then half way towards 16.
    assert limits == [8] * CLEAN_BATCHES + [12]


def serve(guard: MemoryGuard, fits: int, batches: int, max_batch: int = 64,
          ) -> tuple[list[int], list[int]]:
    """Run ``batches`` batches on a device that fits ``fits`` jobs: the size each
    claim asked for, and the batches (by index) that ran out of memory."""
    sizes, ooms = [], []
    for i in range(batches):
        n = guard.limit(KEY, max_batch)
        sizes.append(n)
        if n > fits:  # the executor splits it: both halves run
            ooms.append(i)
            guard.on_out_of_memory(KEY, n)
            guard.after_batch(KEY, n - n // 2, out_of_memory=True)
        else:
            guard.after_batch(KEY, n)
    return sizes, ooms


def test_a_device_that_fits_48_of_64_settles_at_48_and_retries_ever_more_rarely() -> None:
    guard = guard_for(FakeDevice())
    sizes, ooms = serve(guard, fits=48, batches=300)
    # First at 64, then each raise past 48 fails, each after twice the clean batches.
    assert len(ooms) <= 5, ooms
    gaps = [b - a for a, b in zip(ooms, ooms[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] >= 4 * CLEAN_BATCHES, gaps
    assert all(n == 48 for i, n in enumerate(sizes[40:], 40) if i not in ooms)


def test_an_out_of_memory_ceiling_rises_only_while_free_memory_is_above_the_high_watermark(
) -> None:
    device = FakeDevice()
    guard = guard_for(device)
    guard.limit(KEY, 64)
    guard.on_out_of_memory(KEY, 64)
    device.free = GIB + GIB // 4  # above the watermark, below its recovery level
    sizes, _ = serve(guard, fits=64, batches=3 * CLEAN_BATCHES)
    assert set(sizes) == {32}
    device.free = 8 * GIB
    sizes, _ = serve(guard, fits=64, batches=CLEAN_BATCHES + 1)
    assert sizes[-1] == 48


def test_a_short_claim_does_not_become_the_guards_own_limit() -> None:
    guard = guard_for(FakeDevice())
    assert guard.limit(KEY, 2) == 2  # the scheduler cut this claim short (a deadline)
    assert guard.limit(KEY, 32) == 32  # the next full claim is not capped by it
    assert guard.cap(KEY) is None and KEY not in guard.limits


def test_the_claim_takes_the_smaller_of_the_schedulers_cap_and_the_memory_cap() -> None:
    device = FakeDevice()
    guard = guard_for(device)
    device.free = GIB // 2
    assert guard.limit(KEY, 64) == 32
    device.free = GIB + GIB // 4  # hold the memory cap where it is
    assert guard.limit(KEY, 8) == 8
    assert guard.limit(KEY, 64) == 32


def test_a_calibrated_ceiling_caps_the_limit_whatever_the_configuration() -> None:
    guard = guard_for(FakeDevice())
    guard.set_ceiling(KEY, 24)
    assert guard.limit(KEY, 64) == 24
    assert guard.limit(KEY, 8) == 8


def test_the_cache_is_emptied_every_n_batches() -> None:
    calls: list[int] = []
    guard = MemoryGuard(None, empty_cache=lambda: calls.append(1), empty_cache_every=3)
    for _ in range(7):
        guard.after_batch()
    assert len(calls) == 2 and guard.empty_cache_calls == 2


def test_every_shrink_is_told_to_the_listener_with_its_bin() -> None:
    told: list[tuple[str, str]] = []
    guard = guard_for(FakeDevice())
    guard.on_shrink = lambda model, bin_name: told.append((model, bin_name))
    guard.on_out_of_memory(KEY, 8)
    guard.on_out_of_memory(KEY, 4)
    assert told == [KEY, KEY]
