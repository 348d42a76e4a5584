"""Calibration profiles as seeds of the scheduler's cost model (no torch needed)."""

from __future__ import annotations

import pytest

from carpool.scheduling.batching import Cost
from worker.observe.profile import BinProfile, Point, Profile, cost_seed, cost_seeds


def test_a_bins_points_seed_its_cost_model_with_the_least_squares_line() -> None:
    points = [Point(1, 12.0), Point(2, 14.0), Point(4, 18.0), Point(8, 26.0)]  # 10 + 2 n
    seed = cost_seed(BinProfile("b", "[3]", points, largest_fit=8))
    assert seed is not None
    assert seed.a_ms == pytest.approx(10.0) and seed.b_ms == pytest.approx(2.0)


def test_a_profile_without_a_fixed_part_seeds_a_line_through_the_origin() -> None:
    points = [Point(1, 1.0), Point(2, 4.0), Point(4, 8.0)]  # the line fit would cross below 0
    seed = cost_seed(BinProfile("b", "[3]", points, largest_fit=4))
    assert seed is not None and seed.a_ms == 0.0 and seed.b_ms > 0


def test_one_batch_size_cannot_tell_the_fixed_part_from_the_slope() -> None:
    assert cost_seed(BinProfile("b", "[3]", [Point(1, 5.0), Point(1, 5.2)])) is None


def test_each_bin_with_a_seed_is_keyed_by_model_and_bin() -> None:
    profile = Profile("m", "cpu", "d", "t", "now", bins={
        "fast": BinProfile("fast", "[3]", [Point(1, 3.0), Point(4, 6.0)]),
        "slow": BinProfile("slow", "[3]", [Point(1, 3.0)]),
    })
    assert cost_seeds(profile) == {("m", "fast"): Cost(2.0, 1.0)}
