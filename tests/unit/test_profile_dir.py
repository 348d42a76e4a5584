"""Calibration profiles in containers: an absolute default folder, a save that fails
warns instead of stopping the worker, and `carpool calibrate synthetic` works."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from carpool.cli import main
from carpool.core.settings import ExecutorSettings, load_settings
from worker.executors.torch_executor import TorchExecutor
from worker.handlers.synthetic import SyntheticHandler
from worker.observe.calibrate import prepare


def synthetic_handler() -> SyntheticHandler:
    return SyntheticHandler(load_settings({}).catalogue.get("synthetic"), (0.0, 0.0))


def test_an_unwritable_profile_folder_warns_and_the_worker_serves_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "profiles"
    blocker.write_text("a file where the folder should be")  # NotADirectoryError, as in /app
    settings = ExecutorSettings(device="cpu", profile_dir=blocker, calibrate="always")
    executor = TorchExecutor(settings, "cpu")
    try:
        with caplog.at_level(logging.WARNING, logger="worker.observe.profile"):
            profile = prepare(executor, synthetic_handler(), settings)
    finally:
        executor.close()
    assert profile is not None and profile.bins["small"].points  # calibrated, kept in memory
    assert "calibration profile not saved" in caplog.text
    assert "CARPOOL_PROFILE_DIR" in caplog.text


def test_the_default_profile_folder_is_absolute_and_a_relative_one_is_made_so(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert load_settings({}).executor.profile_dir.is_absolute()
    monkeypatch.chdir(tmp_path)
    relative = load_settings({"CARPOOL_PROFILE_DIR": "profiles"}).executor.profile_dir
    assert relative == tmp_path / "profiles"


def test_carpool_calibrate_synthetic_prints_its_table_and_writes_the_profile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CARPOOL_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("CARPOOL_SYNTHETIC_COST_MS", "1,0")
    monkeypatch.setenv("CARPOOL_DEVICE", "cpu")
    assert main(["calibrate", "synthetic", "--reps", "1", "--sizes", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "model synthetic" in out and "knee" in out
    assert len(list(tmp_path.glob("synthetic-*.json"))) == 1
