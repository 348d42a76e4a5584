"""`carpool up --workers MIN..MAX`'s decision (carpool/stack/scaling.py): a fake clock,
no processes, no Redis."""

from __future__ import annotations

import pytest

from carpool.backend.need_gauges import NeedSnapshot
from carpool.backend.registry import WorkerModels
from carpool.core.errors import ConfigError
from carpool.scheduling.batching import Cost
from carpool.scheduling.need import BinLoad, ModelLoad
from carpool.stack.autoscaler import pool_of
from carpool.stack.localstack import pool_bounds
from carpool.stack.scaling import HOLD_DOWN_S, Bounds, PoolWorker, Scaler, parse_workers, wish


def pool(*idle: bool) -> list[PoolWorker]:
    return [PoolWorker(f"worker{i}", i, ok) for i, ok in enumerate(idle)]


def test_workers_is_a_count_or_a_range_and_a_bad_one_says_what_to_give() -> None:
    assert parse_workers("2") == Bounds(2, 2) and not parse_workers("2").scaling
    assert parse_workers("1..3") == Bounds(1, 3) and parse_workers("0..2").scaling
    for bad, why in [("3..1", "MAX (1) is below MIN (3)"), ("0", "at least 1"),
                     ("two", "a range MIN..MAX"), ("1-3", "a range MIN..MAX")]:
        with pytest.raises(ConfigError, match=why.replace("(", r"\(").replace(")", r"\)")):
            parse_workers(bad)


def test_grows_at_once_to_the_wish_capped_at_max() -> None:
    scaler = Scaler(Bounds(1, 3))
    d = scaler.decide(0.0, 2, "why", pool(True))
    assert (d.start, d.stop, d.target, d.why) == (1, (), 2, "why")
    d = scaler.decide(1.0, 7, "more", pool(True, False))
    assert (d.start, d.target) == (1, 3)
    assert scaler.decide(2.0, 9, "more", pool(True, True, True)).start == 0


def test_shrinks_only_after_the_hold_down_to_the_largest_wish_within_it() -> None:
    scaler = Scaler(Bounds(1, 4))
    assert scaler.decide(0.0, 4, "surge", pool(True)).start == 3
    three_idle = pool(True, True, True, True)
    # Within the hold-down after a start nothing stops, whatever the wish.
    assert scaler.decide(HOLD_DOWN_S - 1, 1, "calm", three_idle).stop == ()
    # Past it, the largest wish of the last hold-down decides (2, not the latest 1).
    scaler.decide(HOLD_DOWN_S + 1, 2, "calm", three_idle)
    d = scaler.decide(HOLD_DOWN_S + 2, 1, "calm", three_idle)
    assert (d.stop, d.target) == (("worker3", "worker2"), 2)  # the newest idle first
    assert "the most needed over the last 30 s: 2" in d.why
    d = scaler.decide(2 * HOLD_DOWN_S + 3, 1, "calm", pool(True, True))
    assert (d.stop, d.target) == (("worker1",), 1)


def test_never_below_min_nor_below_the_workers_that_cannot_stop() -> None:
    scaler = Scaler(Bounds(2, 5))
    scaler.decide(0.0, 0, "idle", pool(True, True, True, True))
    # worker1 and worker3 hold leases or are loading: only idle ones stop, down to MIN
    # (2) but not below the 2 pinned plus nothing more.
    d = scaler.decide(HOLD_DOWN_S + 1, 0, "idle", pool(True, False, True, False))
    assert (d.stop, d.target) == (("worker2", "worker0"), 2)
    # Three pinned of four: one stops at most, though MIN is 2 and the wish 0.
    scaler = Scaler(Bounds(2, 5))
    scaler.decide(0.0, 0, "idle", [])
    d = scaler.decide(HOLD_DOWN_S + 1, 0, "idle", pool(False, False, True, False))
    assert (d.stop, d.target) == (("worker2",), 3)


def test_a_fixed_pool_never_changes() -> None:
    scaler = Scaler(Bounds(2, 2))
    assert scaler.decide(0.0, 5, "surge", pool(True, True)).start == 0
    assert scaler.decide(100.0, 0, "idle", pool(True, True)).stop == ()


def load(depth: int, per_ms: float, up: int, loading: int = 0) -> ModelLoad:
    return ModelLoad([BinLoad(depth, 64, Cost(300.0, 5.0), per_ms)], 9_000.0, 10_000.0,
                     3_000.0, up=up, loading=loading)


def test_the_wish_is_the_neediest_model_with_the_rules_reason() -> None:
    # 2.6x one worker's rate of full batches (64 in 620 ms) needs 4 at 85 % busy.
    per_ms = 2.6 * 64 / 620
    wanted, why = wish({"quiet": load(0, 0.0, 1), "synthetic": load(200, per_ms, 1)})
    assert wanted == 4
    assert why.startswith("synthetic needs 4 (")
    assert "200 queued" in why and "268 jobs/s arriving" in why and "1 up" in why
    assert wish({"quiet": load(0, 0.0, 1)}) == (0, "no model needs a worker (idle)")


def test_the_pool_as_the_rule_sees_it_unregistered_and_busy_workers_are_not_idle() -> None:
    live = [WorkerModels("worker0@h", ("synthetic",), {}),
            WorkerModels("worker1@h", ("synthetic",), {}),
            WorkerModels("worker2@h", (), {}, loading=("synthetic",))]
    snap = NeedSnapshot({}, live, frozenset({"worker1@h"}))
    workers, unregistered, starting = pool_of(["worker0", "worker1", "worker2", "worker3"],
                                              snap)
    assert [w.idle for w in workers] == [True, False, False, False]
    assert unregistered == 1 and starting == ["worker2", "worker3"]


def test_a_scaling_pool_on_gpus_takes_one_each_and_claims_it() -> None:
    notes: list[str] = []
    bounds, extra = pool_bounds(Bounds(1, 8), {}, 2, notes)
    assert bounds == Bounds(1, 2) and extra == {"CARPOOL_GPU_CLAIM": "1"}
    assert notes == ["--workers 1..8: 2 GPU(s), so at most 2 workers"]
    # No GPU, or a fixed pool: as before; a claim setting of the user's is kept.
    assert pool_bounds(Bounds(1, 8), {}, 0, []) == (Bounds(1, 8), {})
    assert pool_bounds(Bounds(3, 3), {}, 2, []) == (Bounds(3, 3), {})
    assert pool_bounds(Bounds(1, 2), {"CARPOOL_GPU_CLAIM": "0"}, 2, []) == (Bounds(1, 2), {})
