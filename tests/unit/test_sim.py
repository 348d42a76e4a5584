"""The simulator: exact, repeatable checks of the scheduling rules under load."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from carpool.bench.arrivals import Arrival, arrivals, diurnal_times
from carpool.bench.workload import SizeMix
from carpool.cli import main as carpool_main
from carpool.core.catalogue import BinSpec, ModelSpec, builtin_models
from carpool.scheduling.batching import MAX_BYPASS, Cost
from carpool.sim.engine import SimConfig, simulate
from carpool.sim.summary import percentile, summarize

SPEC = ModelSpec("m", "synthetic", "size", bins=(
    BinSpec("small", max_size=10, max_batch=32, max_wait_ms=20, max_depth=100_000),
    BinSpec("large", max_size=100, max_batch=8, max_wait_ms=20, max_depth=100_000),
))
COST = Cost(20.0, 1.0)
RTT_US = 250


def merged(*schedules: list[Arrival]) -> list[Arrival]:
    return sorted((a for s in schedules for a in s), key=lambda a: a.t_s)


def test_the_same_config_and_schedule_give_the_same_run() -> None:
    schedule = arrivals("poisson", 400, 5, SizeMix.parse("1:0.8,50:0.2"), seed=3)
    config = SimConfig(SPEC, COST, jitter=0.1, seed=3)
    first, again = simulate(config, schedule), simulate(config, schedule)
    assert summarize(first) == summarize(again)
    assert first.batches == again.batches


def test_a_trickle_bin_waits_within_its_bound_while_another_bin_is_flooded() -> None:
    flood = arrivals("poisson", 3 * 32 / COST.ms(32) * 1000, 10, SizeMix.parse("1"), seed=1)
    trickle = [Arrival(0.05 + 0.2 * i, 50) for i in range(50)]
    result = simulate(SimConfig(SPEC, COST, rtt_us=RTT_US), merged(flood, trickle))
    longest_batch_ms = max(COST.ms(b.max_batch) for b in SPEC.bins)
    per_turn_ms = longest_batch_ms + 2 * RTT_US / 1000 + 1  # a batch, a peek and a claim
    # Due after its window; then the batch in hand, MAX_BYPASS longest batches and the
    # one under way when they have passed, the other bins' forced turns, its own batch.
    bound_ms = 20 + (2 + MAX_BYPASS + len(SPEC.bins) - 1) * per_turn_ms + COST.ms(8)
    waits = [j.latency_ms for j in result.jobs if j.bin == "large"]
    assert len(waits) == 50 and max(waits) <= bound_ms
    flooded = [j for j in result.jobs if j.bin == "small"]
    assert sum(j.status == "done" for j in flooded) == len(flooded)


def test_without_the_bypass_rule_the_trickle_bin_would_starve() -> None:
    flood = arrivals("poisson", 3 * 32 / COST.ms(32) * 1000, 10, SizeMix.parse("1"), seed=1)
    trickle = [Arrival(0.05 + 0.2 * i, 50) for i in range(50)]
    never_full = replace(SPEC, bins=(SPEC.bins[0], replace(SPEC.bins[1], max_batch=64)))
    result = simulate(SimConfig(never_full, COST, max_bypass=10**9), merged(flood, trickle))
    first = min(j.done_us for j in result.jobs if j.bin == "large")
    assert first / 1e6 > 10  # not one served before the flood's arrivals ended


def test_a_backlog_drains_oldest_first_so_a_busy_bin_of_short_texts_keeps_up() -> None:
    # minilm's bins, a batch costing 0.4 ms per token of the bin per job, 6 s of work
    # arriving at once on top of 80 % load. Bins taking turns under the backlog (one
    # batch each per round, the long bins' taking seconds) left the busiest bin of
    # short texts behind: its jobs waited longest and some expired.
    minilm = builtin_models()["minilm"]
    spec = replace(minilm, default_deadline_ms=10_000,
                   bins=tuple(replace(b, max_depth=100_000) for b in minilm.bins))
    costs = tuple((b.name, Cost(15, 0.4 * b.max_size)) for b in spec.bins)
    weights = {12: 0.34, 24: 0.26, 48: 0.2, 100: 0.12, 200: 0.06, 400: 0.02}
    mix = SizeMix.parse(",".join(f"{size}:{w}" for size, w in weights.items()))
    job_ms = sum(w * dict(costs)[spec.bin_for(size).name].ms(spec.bin_for(size).max_batch)
                 / spec.bin_for(size).max_batch for size, w in weights.items())
    burst = arrivals("poisson", 6 * 1000 / job_ms, 1, mix, seed=6)
    steady = arrivals("poisson", 0.8 * 1000 / job_ms, 30, mix, seed=5)
    result = simulate(SimConfig(spec, Cost(15, 1), bin_costs=costs), merged(burst, steady))
    short = [j for j in result.jobs if j.bin == "t16"]
    assert not [j for j in short if j.status != "done"]
    assert percentile(sorted(j.latency_ms for j in short), 50) <= percentile(
        sorted(j.latency_ms for j in result.jobs if j.status == "done"), 50)


def test_jobs_whose_deadline_passes_in_the_queue_are_never_run() -> None:
    spec = replace(SPEC, default_deadline_ms=100)
    schedule = arrivals("poisson", 2 * 32 / COST.ms(32) * 1000, 5, SizeMix.parse("1"), seed=2)
    result = simulate(SimConfig(spec, COST), schedule)
    expired = [j for j in result.jobs if j.status == "expired"]
    done = [j for j in result.jobs if j.status == "done"]
    assert expired and done and len(expired) + len(done) == len(schedule)
    assert all(j.claim_us == -1 for j in expired)  # never part of a batch
    assert all(j.claim_us // 1000 < j.deadline_ms for j in done)
    assert sum(b.size for b in result.batches) == len(done)


def test_under_overload_no_job_is_run_that_its_batch_could_not_finish_in_time() -> None:
    # Twice what the worker drains, 100 ms deadlines and no admission: the queue stays
    # at the deadline, so most jobs reach their claim with less time left than a batch.
    spec = replace(SPEC, default_deadline_ms=100)
    schedule = arrivals("poisson", 2 * 32 / COST.ms(32) * 1000, 5, SizeMix.parse("1"), seed=2)
    result = simulate(SimConfig(spec, COST, cost_seed=COST), schedule)
    done = [j for j in result.jobs if j.status == "done"]
    expired = [j for j in result.jobs if j.status == "expired"]
    assert done and expired
    # Computed jobs end by their deadline (a 5 % slack for the fit), not past it.
    assert all(j.done_us - j.claim_us <= 1.05 * (j.deadline_ms * 1000 - j.claim_us)
               for j in done)


def test_a_batch_leaves_in_time_for_its_most_urgent_deadline() -> None:
    cost = Cost(5.0, 0.2)
    long_window = replace(SPEC, bins=tuple(replace(b, max_wait_ms=500) for b in SPEC.bins))
    schedule = [replace(a, deadline_ms=40) for a in
                arrivals("poisson", 300, 10, SizeMix.parse("1"), seed=4)]
    for adaptive in (False, True):
        config = SimConfig(long_window, cost, adaptive=adaptive, cost_seed=cost)
        result = simulate(config, schedule)
        # From the first second on: before it, the arrival rate is not known yet (the
        # first batch, leaving late, gives up the jobs it would have finished late).
        settled = [j for j in result.jobs if j.admit_us >= 1_000_000]
        assert all(j.status == "done" for j in settled)
        assert max(j.done_us - j.deadline_ms * 1000 for j in settled) <= 0


def test_jobs_go_earliest_deadline_first_within_a_bin() -> None:
    spec = replace(SPEC, bins=(replace(SPEC.bins[0], max_batch=1),))
    schedule = [Arrival(0.0, 1, deadline_ms=d) for d in (900, 300, 600, 300, 0)]
    result = simulate(SimConfig(spec, COST, adaptive=False), schedule)
    order = sorted(result.jobs, key=lambda j: j.done_us)
    assert [schedule[j.seq].deadline_ms for j in order] == [300, 300, 600, 900, 0]
    assert [j.seq for j in order][:2] == [1, 3]  # equal deadlines: first in, first out


def test_a_p99_target_shrinks_batches_until_it_is_met() -> None:
    cost = Cost(5.0, 2.0)
    window = replace(SPEC, bins=(replace(SPEC.bins[0], max_batch=256, max_wait_ms=200),))
    schedule = arrivals("poisson", 200, 30, SizeMix.parse("1"), seed=5)
    plain = simulate(SimConfig(window, cost, adaptive=False), schedule)
    slo = simulate(SimConfig(replace(window, p99_target_ms=120), cost, adaptive=False), schedule)
    late = [j.latency_ms for j in slo.jobs if j.admit_us > 15_000_000]
    assert percentile(sorted(late), 99) <= 120 < summarize(plain).p99_ms
    assert summarize(slo).throughput_per_s >= 0.97 * summarize(plain).throughput_per_s


def test_a_diurnal_curve_follows_its_sine() -> None:
    times = diurnal_times(100, 100, 0.8, 100, seed=6)
    first_half = sum(t < 50 for t in times)
    assert first_half > 2 * (len(times) - first_half)


def test_carpool_bench_simulate_runs_the_sweep_and_writes_its_results(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    assert carpool_main(["bench", "simulate", "--loads", "0.5", "--patterns", "poisson",
                         "--duration", "2", "--no-plots", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in rows} >= {"adaptive"} and {r["load"] for r in rows} == {0.5}
    assert "p50 ms / p99 ms" in (out / "summary.md").read_text()
    assert "| 50% |" in capsys.readouterr().out
