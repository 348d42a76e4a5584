"""Calibration on the CPU: a profile per device, model and bins, reused at the next
start; the knee; `carpool calibrate` prints the table and writes a PNG."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from carpool.cli import main
from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.settings import ExecutorSettings, load_settings
from tests.support.procs import REPO_ROOT
from tests.support.simcuda import MIB, SimCuda, SimHandler
from worker.executors.ladder import rungs
from worker.executors.torch_executor import TorchExecutor
from worker.handlers.image import ImageHandler
from worker.observe.calibrate import calibrate, ladder, prepare
from worker.observe.profile import BinProfile, Point, digest, load, path_for
from worker.shell.bootstep import make_executor

torch.set_num_threads(1)
CONFIG = """
[models.tinyimg]
kind = "image"
measure = "pixels"
options = {arch = "resnet18", weights = "random", num_classes = 4, resize = 40, crop = 32}
[[models.tinyimg.bins]]
name = "fast"
max_size = 262144
max_batch = 4
max_wait_ms = 5
max_depth = 64
[[models.tinyimg.bins]]
name = "slow"
max_size = 40000000
max_batch = 2
max_wait_ms = 50
max_depth = 64
"""


def tiny_spec() -> ModelSpec:
    bins = (BinSpec("fast", 262144, 4, 5, 64), BinSpec("slow", 40_000_000, 4, 50, 64))
    return ModelSpec("tinyimg", "image", "pixels", bins, options={
        "arch": "resnet18", "weights": "random", "num_classes": 4, "resize": 40, "crop": 32})


@pytest.fixture(scope="module")
def handler() -> ImageHandler:
    h = ImageHandler(tiny_spec(), "cpu")
    h.load()
    return h


def test_the_ladder_doubles_up_to_max_batch_and_keeps_max_batch_itself() -> None:
    assert ladder(12, 12) == [1, 2, 4, 8, 12]
    assert ladder(16, 64) == [1, 2, 4, 8, 16, 32, 64]


def test_the_knee_is_the_last_size_whose_time_per_item_still_improves_by_a_tenth() -> None:
    points = [Point(1, 10.0), Point(2, 12.0), Point(4, 16.0), Point(8, 30.0), Point(16, 58.0)]
    # ms/item: 10, 6, 4, 3.75 (only 6 % better), 3.6
    assert BinProfile("b", "[3]", points, largest_fit=16).knee == 4


def test_bins_of_one_shape_are_measured_once_and_share_their_profile(
        handler: ImageHandler) -> None:
    executor = TorchExecutor(ExecutorSettings(device="cpu"), "cpu")
    profile = calibrate(executor, handler, reps=1)
    executor.close()
    fast, slow = profile.bins["fast"], profile.bins["slow"]
    assert [p.batch for p in fast.points] == [1, 2, 4]
    assert fast.points == slow.points and fast.shape == "[3, 32, 32]"
    assert fast.largest_fit == 4 and fast.out_of_memory_at is None
    assert all(p.ms > 0 for p in fast.points)


def test_a_saved_profile_is_reused_at_the_next_start_and_a_changed_bin_is_not(
        handler: ImageHandler, tmp_path: Path) -> None:
    settings = ExecutorSettings(device="cpu", profile_dir=tmp_path, calibrate="always")
    executor = TorchExecutor(settings, "cpu")
    first = prepare(executor, handler, settings)
    assert first is not None
    key = digest(handler.spec, first.device, torch.__version__)
    saved = load(path_for(tmp_path, handler.spec, key), key)
    assert saved is not None and saved.bins["fast"].points == first.bins["fast"].points
    again = prepare(executor, handler, ExecutorSettings(device="cpu", profile_dir=tmp_path))
    assert again is not None and again.created == first.created  # read, not re-measured
    executor.close()
    changed = ModelSpec(handler.spec.name, "image", "pixels",
                        (BinSpec("fast", 262144, 8, 5, 64),), options=handler.spec.options)
    assert digest(changed, first.device, torch.__version__) != key


def test_carpool_calibrate_prints_the_table_and_writes_the_profile_and_a_png(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "carpool.toml"
    config.write_text(CONFIG)
    monkeypatch.setenv("CARPOOL_CONFIG", str(config))
    monkeypatch.setenv("CARPOOL_DEVICE", "cpu")
    monkeypatch.setenv("CARPOOL_PROFILE_DIR", str(tmp_path / "profiles"))
    assert main(["calibrate", "tinyimg", "--reps", "1", "--sizes", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "knee" in out and "items/s" in out
    pngs = list((tmp_path / "profiles").glob("tinyimg-*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "profiles").glob("tinyimg-*.json"))) == 1


def test_one_step_that_gains_little_does_not_hide_a_later_gain_from_the_knee() -> None:
    points = [Point(1, 65.8), Point(2, 119.6), Point(4, 183.2), Point(8, 362.9)]
    # ms/item: 65.8, 59.8 (9 % better: not enough), 45.8 (23 % better), 45.4
    assert BinProfile("b", "[3]", points, largest_fit=8).knee == 4


def test_a_torch_worker_seeds_each_bins_cost_model_from_its_calibration_profile(
        handler: ImageHandler, tmp_path: Path) -> None:
    executor_settings = ExecutorSettings(device="cpu", profile_dir=tmp_path, calibrate="always")
    settings = replace(load_settings({}), executor=executor_settings)
    executor, seeds = make_executor(settings, {"tinyimg": handler})
    executor.close()
    assert set(seeds) == {("tinyimg", "fast"), ("tinyimg", "slow")}
    assert all(s.a_ms >= 0 and s.b_ms >= 0 and s.ms(4) > 0 for s in seeds.values())


# -- on a simulated GPU (tests/support/simcuda.py) ---------------------------------------------
SIM_BIN = BinSpec("only", max_size=10, max_batch=8, max_wait_ms=0, max_depth=100)
SIM_SPEC = ModelSpec("sim", "sim", "size", (SIM_BIN,))
SIM_KEY = ("sim", "only")


def sim_executor(sim: SimCuda) -> TorchExecutor:
    return TorchExecutor(ExecutorSettings(device="cuda", torch_threads=0), sim)


def test_a_probe_out_of_memory_caps_the_bin_at_largest_fit_before_warm_up(
        tmp_path: Path) -> None:
    sim = SimCuda(64 * MIB)
    handler = SimHandler(sim, SIM_SPEC, bytes_per_item=10 * MIB)  # fits 6 rows, not 8
    settings = ExecutorSettings(device="cuda", profile_dir=tmp_path, calibrate="auto")
    executor = sim_executor(sim)
    profile = prepare(executor, handler, settings)
    executor.close()
    assert profile is not None
    only = profile.bins["only"]
    assert (only.largest_fit, only.out_of_memory_at) == (4, 8)
    assert executor.guard.ceilings[SIM_KEY] == only.largest_fit
    assert executor.guard.limit(SIM_KEY, 8) == 4
    probed = len(sim.ops("oom"))
    # Warm-up ran every rung up to the ceiling, and nothing above it.
    warm = [k[3] for k in sim.ops("kernel")][-len(rungs(4)):]
    assert warm == rungs(4) and probed == 1


def test_a_worker_restarting_on_a_saved_profile_never_warms_up_above_its_ceiling(
        tmp_path: Path) -> None:
    settings = ExecutorSettings(device="cuda", profile_dir=tmp_path, calibrate="auto")
    first_sim = SimCuda(64 * MIB)
    first = sim_executor(first_sim)
    prepare(first, SimHandler(first_sim, SIM_SPEC, bytes_per_item=10 * MIB), settings)
    first.close()
    sim = SimCuda(64 * MIB)  # the restart: a fresh process, the same device
    executor = sim_executor(sim)
    profile = prepare(executor, SimHandler(sim, SIM_SPEC, bytes_per_item=10 * MIB), settings)
    executor.close()
    assert profile is not None and profile.bins["only"].out_of_memory_at == 8  # reused
    assert sim.ops("oom") == []
    assert max(k[3] for k in sim.ops("kernel")) == 4
    assert executor.guard.limit(SIM_KEY, 8) == 4


def test_a_probe_failure_not_typed_as_out_of_memory_costs_a_smaller_ceiling_not_the_start(
        tmp_path: Path) -> None:
    sim = SimCuda(1 << 30)
    handler = SimHandler(sim, SIM_SPEC)
    handler.fail_over = 2
    handler.failure = RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR")
    settings = ExecutorSettings(device="cuda", profile_dir=tmp_path, calibrate="always")
    executor = sim_executor(sim)
    profile = prepare(executor, handler, settings)
    executor.close()
    assert profile is not None and profile.bins["only"].largest_fit == 2
    assert executor.guard.limit(SIM_KEY, 8) == 2


def test_the_docs_name_largest_fit_as_the_ceiling(tmp_path: Path) -> None:
    """The name the docs give the guard's ceiling is the profile field it is set from,
    as an operator reads it in CARPOOL_PROFILE_DIR."""
    sim = SimCuda(64 * MIB)
    handler = SimHandler(sim, SIM_SPEC, bytes_per_item=10 * MIB)  # fits 6 rows, not 8
    executor = sim_executor(sim)
    prepare(executor, handler,
            ExecutorSettings(device="cuda", profile_dir=tmp_path, calibrate="auto"))
    executor.close()
    [saved] = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert saved["bins"]["only"]["largest_fit"] == executor.guard.ceilings[SIM_KEY] == 4
    docs = (REPO_ROOT / "docs" / "architecture.md").read_text()
    calibration = next(p for p in docs.split("\n\n") if p.startswith("**Calibration**"))
    assert "ceiling" in calibration and "`largest_fit`" in calibration
