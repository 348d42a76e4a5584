"""The web's default worker count: the cores it may use, a container's CPU quota included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from web.gunicorn_conf import available_cores

AFFINITY = len(os.sched_getaffinity(0))


def test_without_a_quota_every_core_of_the_affinity_counts(tmp_path: Path) -> None:
    assert available_cores(tmp_path) == AFFINITY
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(tmp_path) == AFFINITY


@pytest.mark.parametrize(("quota", "cpus"), [("50000 100000", 1), ("150000 100000", 2),
                                             ("100000 100000", 1)])
def test_a_cgroup_v2_quota_caps_the_cores_rounded_up(tmp_path: Path, quota: str,
                                                      cpus: int) -> None:
    (tmp_path / "cpu.max").write_text(quota + "\n")
    assert available_cores(tmp_path) == min(AFFINITY, cpus)


def test_a_cgroup_v1_quota_caps_them_too_and_no_quota_is_minus_one(tmp_path: Path) -> None:
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    assert available_cores(tmp_path) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert available_cores(tmp_path) == AFFINITY


def test_an_unreadable_quota_falls_back_to_the_affinity(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("lots\n")
    assert available_cores(tmp_path) == AFFINITY
