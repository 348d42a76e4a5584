"""The bench's stacks: the shipped command lines, and one catalogue file per policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.bench.policies import FIXED_WINDOW_CAP, POLICIES, policy, write_config
from carpool.bench.stack import WEB_ARGV, WORKER_ARGV
from carpool.core.catalogue import builtin_models, load_catalogue
from carpool.core.settings import load_settings
from tests.support.commands import argv


def test_stacks_start_the_shipped_command_lines() -> None:
    assert WEB_ARGV == argv("web")
    assert WORKER_ARGV == argv("worker")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_policy_writes_a_catalogue_the_worker_can_load(name: str, tmp_path: Path) -> None:
    spec = builtin_models()["synthetic"]
    bins = policy(name).bins(spec, min_depth=8000)
    loaded = load_catalogue(write_config(tmp_path / "c.toml", spec, bins)).get("synthetic")
    assert loaded.bins == bins
    assert all(b.max_depth >= 8000 for b in loaded.bins)


def test_per_job_runs_every_job_alone_and_fixed_window_waits_for_its_window() -> None:
    spec = builtin_models()["synthetic"]
    assert {(b.max_batch, b.max_wait_ms) for b in policy("per-job").bins(spec)} == {(1, 0)}
    window = policy("fixed-window").bins(spec)
    assert [b.max_wait_ms for b in window] == [b.max_wait_ms for b in spec.bins]
    assert {b.max_batch for b in window} == {FIXED_WINDOW_CAP}


def test_fixed_window_workers_run_without_adaptive_batching() -> None:
    assert load_settings(dict(policy("fixed-window").env)).adaptive_batching is False
    assert "CARPOOL_ADAPTIVE_BATCHING" not in policy("configured").env


def test_analytical_limit_is_max_batch_over_one_full_batchs_cost() -> None:
    spec = builtin_models()["synthetic"]
    # a = 20 ms, b = 1 ms, max_batch 32: 32 jobs per 52 ms.
    assert policy("configured").limit_per_s(spec, "small", (20.0, 1.0)) == pytest.approx(
        32 / 0.052)
    assert policy("per-job").limit_per_s(spec, "small", (20.0, 1.0)) == pytest.approx(1 / 0.021)


def test_an_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="configured"):
        policy("greedy")
