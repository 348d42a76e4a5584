"""Arrival schedules are deterministic for a seed and have the asked-for mean rate."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from carpool.bench.arrivals import (
    Bursts,
    all_at_once,
    burst_times,
    load_trace,
    poisson_times,
    with_sizes,
)
from carpool.bench.workload import SizeMix


def _within_poisson_noise(count: int, expected: float) -> bool:
    # A Poisson count has standard deviation sqrt(mean); 5 of them is a generous bound.
    return abs(count - expected) <= 5 * math.sqrt(expected)


def test_poisson_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    assert poisson_times(100, 10, seed=3) == poisson_times(100, 10, seed=3)
    assert poisson_times(100, 10, seed=3) != poisson_times(100, 10, seed=4)


def test_poisson_has_the_mean_rate_asked_for() -> None:
    times = poisson_times(500, 40, seed=1)
    assert _within_poisson_noise(len(times), 500 * 40)
    assert times == sorted(times) and 0 < times[0] and times[-1] < 40


def test_poisson_gaps_look_exponential() -> None:
    times = poisson_times(200, 50, seed=2)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    # For an exponential distribution the standard deviation equals the mean.
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert mean == pytest.approx(1 / 200, rel=0.05)
    assert sd == pytest.approx(mean, rel=0.1)


def test_bursts_multiply_the_rate_during_each_burst() -> None:
    bursts = Bursts(factor=4, burst_s=1, period_s=5)
    times = burst_times(100, 50, bursts, seed=5)
    assert _within_poisson_noise(len(times), 100 * 50 * bursts.mean_factor())
    in_burst = sum(1 for t in times if t % 5 >= 4)
    assert _within_poisson_noise(in_burst, 400 * 10)
    assert burst_times(100, 50, bursts, seed=5) == times


def test_bursts_refuse_a_burst_longer_than_its_period() -> None:
    with pytest.raises(ValueError):
        Bursts(factor=2, burst_s=6, period_s=5)


def test_sizes_follow_the_mix_without_changing_the_times() -> None:
    times = poisson_times(100, 30, seed=9)
    mix = SizeMix.parse("16:0.75,500:0.25")
    arrivals = with_sizes(times, mix, seed=9)
    assert [a.t_s for a in arrivals] == times
    large = sum(1 for a in arrivals if a.size == 500)
    assert abs(large / len(arrivals) - 0.25) < 0.05
    assert with_sizes(times, SizeMix.parse("16"), seed=9)[0].size == 16


def test_size_mix_refuses_nonsense() -> None:
    for text in ("", "a", "16:x", "-1", "16:0"):
        with pytest.raises(ValueError):
            SizeMix.parse(text)


def test_trace_lines_give_times_sizes_and_values(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0.5, "size": 300, "value": "x"}\n0.25\n\n{"t": 1}\n')
    arrivals = load_trace(trace, SizeMix.parse("16"), seed=1)
    assert [(a.t_s, a.size, a.payload) for a in arrivals] == [
        (0.25, 16, None), (0.5, 300, "x"), (1.0, 16, None)]


def test_a_bad_trace_line_names_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0.5}\n{"size": 3}\n')
    with pytest.raises(ValueError, match=":2:"):
        load_trace(trace, SizeMix.parse("16"), seed=1)


def test_a_backlog_arrives_all_at_once() -> None:
    arrivals = all_at_once(50, SizeMix.parse("16"), seed=1)
    assert len(arrivals) == 50 and {a.t_s for a in arrivals} == {0.0}


def test_size_draws_are_reproducible() -> None:
    mix = SizeMix.parse("1,2,3")
    first, second = random.Random(4), random.Random(4)
    draws = [mix.draw(first) for _ in range(30)]
    assert draws == [mix.draw(second) for _ in range(30)]
    assert set(draws) == {1, 2, 3}
