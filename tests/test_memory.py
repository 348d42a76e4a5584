"""The memory guard, driven by an injected memory reader: no GPU needed."""

from __future__ import annotations

from worker.memory import MemoryGuard

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
    assert [guard.limit(KEY, 16) for _ in range(4)] == [10, 12, 14, 16]


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
