"""The scheduler around the pure decision: bypass counts, retuning, fitting, snapshots."""

import json
from dataclasses import replace

import pytest

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.jobs import BinState
from carpool.scheduling.batching import MAX_BYPASS, Cost, Go, Wait
from carpool.scheduling.scheduler import Scheduler
from carpool.scheduling.slo import WINDOW_JOBS

SPEC = ModelSpec("m", "synthetic", "size", bins=(
    BinSpec("a", max_size=10, max_batch=8, max_wait_ms=20, max_depth=100),
    BinSpec("b", max_size=20, max_batch=8, max_wait_ms=20, max_depth=100),
))


def st(bin_name: str, depth: int, oldest: int | None, admitted: int = 0) -> BinState:
    return BinState("m", bin_name, depth, oldest, None, admitted)


def test_a_due_bin_under_a_flood_on_another_bin_goes_within_max_bypass_plus_one_turns() -> None:
    sched = Scheduler([SPEC], adaptive=False)
    served = []
    for turn in range(MAX_BYPASS + 1):
        now = 1000 + turn * 50
        go = sched.decide(now, [st("a", 50, now - 500), st("b", 1, 900)])
        assert isinstance(go, Go)
        served.append(go.bin)
    assert served == ["a"] * MAX_BYPASS + ["b"]


def test_a_backlog_is_served_oldest_first_not_in_turns_once_costs_are_known() -> None:
    # Bin a's batches are cheap, b's dear, both always full: a's oldest job is the
    # oldest for six decisions, so a goes six times (turns would let b in after four).
    seeds = {("m", "a"): Cost(20, 1), ("m", "b"): Cost(20, 100)}
    sched = Scheduler([SPEC], adaptive=False, cost_seeds=seeds)
    served = []
    for turn in range(MAX_BYPASS + 3):
        now = 1000 + turn * 30  # a's batch takes 28 ms
        go = sched.decide(now, [st("a", 50, 500 + turn * 45), st("b", 50, 760)])
        assert isinstance(go, Go)
        served.append(go.bin)
    assert served == ["a"] * (MAX_BYPASS + 2) + ["b"]


def test_passes_count_in_a_row_a_bin_emptied_elsewhere_starts_again() -> None:
    # b is passed over three times, then emptied (another worker served it): a minute
    # later, in a new backlog where a's jobs are older, b's old passes do not force it.
    seeds = {("m", "a"): Cost(20, 1), ("m", "b"): Cost(20, 100)}
    sched = Scheduler([SPEC], adaptive=False, cost_seeds=seeds)
    for turn in range(MAX_BYPASS - 1):
        now = 1000 + turn * 30
        assert sched.decide(now, [st("a", 50, 500), st("b", 50, 900)]).bin == "a"  # type: ignore[union-attr]
    sched.decide(1200, [st("a", 50, 500), st("b", 0, None)])
    served = [sched.decide(61_000 + turn * 30, [st("a", 50, 60_000 + turn), st("b", 50, 60_500)])
              for turn in range(3)]
    assert [go.bin for go in served] == ["a"] * 3  # type: ignore[union-attr]


def test_retuning_changes_the_next_decision_and_reset_restores_the_catalogue() -> None:
    sched = Scheduler([SPEC], adaptive=False)
    assert sched.decide(1000, [st("a", 3, 1000)]) == Wait(1020)
    sched.tune("m", "a", max_batch=3)
    assert sched.decide(1000, [st("a", 3, 1000)]) == Go("m", "a", 3)
    assert sched.scan_sizes([("m", "a"), ("m", "b")]) == [3, 8]
    sched.tune("m", max_wait_ms=0, adaptive=True)
    assert sched.limits(("m", "b")).max_wait_ms == 0 and sched.limits(("m", "b")).adaptive
    sched.tune("m", reset=True)
    assert sched.limits(("m", "a")) == replace(sched.limits(("m", "a")), max_batch=8,
                                               max_wait_ms=20, adaptive=False)


def test_a_paused_model_is_not_served_until_resumed() -> None:
    sched = Scheduler([SPEC])
    sched.tune("m", paused=True)
    assert sched.decide(5000, [st("a", 8, 1000)]) == Wait(None)
    sched.tune("m", paused=False)
    assert sched.decide(5000, [st("a", 8, 1000)]) == Go("m", "a", 8)


@pytest.mark.parametrize("model,bin_name,changes,error", [
    ("nope", None, {"max_batch": 2}, ConfigError),
    ("m", "zz", {"max_batch": 2}, ConfigError),
    ("m", None, {"colour": 2}, ConfigError),
    ("m", None, {"max_batch": 0}, ValueError),
])
def test_tuning_refuses_unknown_names_and_values_out_of_range(
        model: str, bin_name: str | None, changes: dict[str, int], error: type[Exception]) -> None:
    with pytest.raises(error):
        Scheduler([SPEC]).tune(model, bin_name, **changes)


def test_finished_batches_fit_the_cost_model_and_show_in_the_snapshot() -> None:
    sched = Scheduler([SPEC], cost_seeds={("m", "b"): Cost(5.0, 0.5)})
    for n in (1, 4, 8, 2):
        sched.observe("m", "a", n, 10.0 + 2.0 * n, [20.0] * n)
    snap = {(e["model"], e["bin"]): e for e in sched.snapshot()}
    assert snap[("m", "a")]["cost_ms"] == {"a": 10.0, "b": 2.0, "batches": 4}
    assert snap[("m", "a")]["recent_batch_sizes"] == [1, 4, 8, 2]
    assert snap[("m", "b")]["cost_ms"]["a"] == 5.0  # the seed, before any batch
    json.dumps(snap[("m", "a")])


def test_a_claim_gives_up_jobs_by_the_bins_fitted_cost_or_the_seed_before_it() -> None:
    sched = Scheduler([SPEC], cost_seeds={("m", "b"): Cost(5.0, 0.5)})
    assert sched.cost_of(("m", "a")) is None  # nothing known: nothing given up for it
    assert sched.cost_of(("m", "b")) == Cost(5.0, 0.5)
    for n in (1, 4, 8, 2):
        sched.observe("m", "a", n, 10.0 + 2.0 * n, [20.0] * n)
    cost = sched.cost_of(("m", "a"))
    assert cost is not None and (round(cost.a_ms, 6), round(cost.b_ms, 6)) == (10.0, 2.0)


def test_the_arrival_rate_comes_from_the_admitted_counter() -> None:
    sched = Scheduler([SPEC])
    for t in range(0, 2001, 10):
        sched.decide(t, [st("a", 0, None, admitted=t // 10)])
    rate = {e["bin"]: e["arrivals_per_s"] for e in sched.snapshot()}
    assert rate["a"] == pytest.approx(100.0, rel=0.03) and rate["b"] == 0.0


def test_a_p99_target_shrinks_max_batch_when_missed() -> None:
    sched = Scheduler([replace(SPEC, p99_target_ms=50)], adaptive=False)
    for i in range(WINDOW_JOBS // 4):  # each batch held: the worker waited for its window
        assert isinstance(sched.decide(1000 * i, [st("a", 4, 1000 * i)]), Wait)
        assert isinstance(sched.decide(1000 * i + 20, [st("a", 4, 1000 * i)]), Go)
        sched.observe("m", "a", 4, 40.0, [500.0] * 4)
    assert sched.limits(("m", "a")).max_batch == 6
    assert sched.scan_sizes([("m", "a")]) == [6]
    sched.tune("m", p99_target_ms=0)
    assert sched.limits(("m", "a")).max_batch == 8
