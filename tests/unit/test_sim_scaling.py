"""The autoscaling simulation (carpool/sim/scaling.py): jobs accounted for, the
envelope every policy shares, and each policy's own rule from zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.sim.scaling import (
    BacklogPerInstance,
    NeedRule,
    Observation,
    QueueLength,
    ScalingConfig,
    burst_trace,
    simulate,
    standard_policies,
)
from carpool.sim.scaling_cli import main

CONFIG = ScalingConfig()
CAP = CONFIG.per_worker_per_s()


def test_every_offered_job_is_refused_served_or_expired() -> None:
    for policy in standard_policies(CONFIG):
        out = simulate(policy, burst_trace(0.3 * CAP), 900.0, CONFIG)
        assert out.offered == pytest.approx(out.refused + out.served + out.expired, rel=1e-9)
        assert out.late <= out.served


def test_a_load_one_worker_carries_needs_no_second_and_misses_nothing() -> None:
    out = simulate(NeedRule(CONFIG), lambda t: 0.3 * CAP, 600.0, CONFIG)
    assert (out.refused, out.misses, out.peak_workers) == (0, 0, 1)
    assert out.gpu_s == pytest.approx(600.0)


def test_from_zero_the_rule_starts_at_the_first_poll_and_sagemaker_after_its_alarm() -> None:
    zero = ScalingConfig(start_workers=0)
    trace = burst_trace(0.0, burst_at_s=100.0, burst_s=200.0, level_per_s=0.2 * CAP)

    def first_start_s(policy: object) -> float:
        out = simulate(policy, trace, 400.0, zero)  # type: ignore[arg-type]
        return next(t for t, workers, *_ in out.series if workers > 0)

    assert first_start_s(NeedRule(zero)) == 105.0  # the first poll after 100 s
    assert first_start_s(QueueLength()) == 105.0
    assert first_start_s(BacklogPerInstance()) >= 165.0  # plus the one-minute alarm


def test_the_envelope_steps_down_one_worker_a_minute_after_the_window() -> None:
    class Wish:
        name = "4 then 0"

        def desired(self, obs: Observation) -> int:
            return 4 if obs.now_s < 60 else 0

    out = simulate(Wish(), lambda t: 0.0, 900.0, CONFIG)
    workers = {t: w for t, w, *_ in out.series}
    assert workers[0.0] == 4 and workers[345.0] == 4  # the last 4 was wished at 45 s
    downs = [t for t, w in sorted(workers.items()) if t and w < workers[t - 15.0]]
    assert downs == [360.0, 420.0, 480.0, 540.0]


def test_the_command_writes_its_table_and_refuses_an_unknown_scenario(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "needed.prom"
    assert main(["--scenarios", "from-zero", "--no-plots", "--out", str(tmp_path),
                 "--record", str(record)]) == 0
    assert "| carpool need rule |" in (tmp_path / "summary.md").read_text()
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 5
    assert 'carpool_workers_needed{model="synthetic",pod="web-1"}' in record.read_text()
    assert main(["--scenarios", "nope", "--no-plots", "--out", str(tmp_path)]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
