"""Which models a worker serves when one cannot load, and which executor it gets."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from carpool.core.errors import ConfigError
from carpool.core.settings import Settings
from worker.executors.pipelined import PipelinedExecutor
from worker.shell.bootstep import load_handlers, make_executor


def test_a_model_named_in_carpool_models_without_weights_stops_the_worker(
        settings: Settings) -> None:
    with pytest.raises(ConfigError, match="'resnet18' has no weights"):
        load_handlers(settings, ("synthetic", "resnet18"), explicit=True)


def test_serving_every_model_leaves_out_one_without_weights_and_says_so(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="worker.shell.bootstep"):
        handlers = load_handlers(settings, ("synthetic", "resnet18"), explicit=False)
    assert list(handlers) == ["synthetic"]
    assert "not serving model 'resnet18'" in caplog.text


def test_a_synthetic_only_worker_pipelines_two_batches_without_torch(
        settings: Settings) -> None:
    handlers = load_handlers(settings, ("synthetic",), explicit=True)
    executor, seeds = make_executor(settings, handlers)
    assert isinstance(executor, PipelinedExecutor) and executor.depth == 2
    assert seeds == {}  # no calibration without torch
    executor.close()
    inline = replace(settings, executor=replace(settings.executor, pipeline_depth=1))
    one_at_a_time = make_executor(inline, handlers)[0]
    assert isinstance(one_at_a_time, PipelinedExecutor) and one_at_a_time.depth == 1
    one_at_a_time.close()


def test_a_synthetic_only_worker_never_imports_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from carpool.core.settings import load_settings; "
            "from worker.shell.bootstep import load_handlers, make_executor; "
            "s = load_settings({}); make_executor(s, load_handlers(s, ('synthetic',), True)); "
            "import worker.celery_app; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parent.parent.parent)


def test_the_limits_metrics_read_carry_the_memory_guards_cap(settings: Settings) -> None:
    from worker.loop.loop import BatchLoop
    handlers = load_handlers(settings, ("synthetic",), explicit=True)
    executor = PipelinedExecutor()
    loop = BatchLoop(settings, None, handlers, "w", executor=executor)  # type: ignore[arg-type]
    executor.guard.on_out_of_memory(("synthetic", "small"), 32)
    limits = loop.live_limits()
    assert limits[("synthetic", "small")].max_batch == 16
    assert limits[("synthetic", "medium")] == loop.limits[("synthetic", "medium")]


def test_the_limits_metrics_and_flower_read_follow_a_live_retune(settings: Settings) -> None:
    from worker.loop.loop import BatchLoop
    from worker.observe.flower import worker_info

    handlers = load_handlers(settings, ("synthetic",), explicit=True)
    loop = BatchLoop(settings, None, handlers, "w")  # type: ignore[arg-type]
    loop.scheduler.tune("synthetic", "medium", max_batch=8, max_wait_ms=3, adaptive=False)
    assert loop.live_limits()[("synthetic", "medium")].max_batch == 8
    shown = worker_info(loop, None)["batch_limits"]
    assert shown["synthetic/medium"] == {"max_batch": 8, "max_wait_ms": 3, "adaptive": False,
                                         "paused": False}
    assert shown["synthetic/small"]["max_batch"] == 32


def test_the_worker_refuses_to_start_under_a_forking_pool() -> None:
    from celery.concurrency import get_implementation

    from worker.shell.bootstep import require_solo_pool

    require_solo_pool(get_implementation("solo"))
    for pool in ("prefork", "threads"):
        with pytest.raises(ConfigError, match="--pool solo"):
            require_solo_pool(get_implementation(pool))


def test_a_scrape_reads_the_memory_of_the_executors_gpu_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Four GPUs visible; the executor on cuda:2: no CUDA context on the other three."""
    import types

    import torch

    from worker.shell.bootstep import gpu_memory_reader

    asked: list[int] = []

    def mem_get_info(i: int) -> tuple[int, int]:
        asked.append(i)
        return 5 << 30, 8 << 30

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 1 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid=f"000{i}"))
    executor = types.SimpleNamespace(device=torch.device("cuda:2"))
    read = gpu_memory_reader(executor)  # type: ignore[arg-type]
    for _ in range(3):
        assert [g.gpu for g in read()] == ["GPU-0002"]
    assert asked == [2, 2, 2]


def test_a_lost_device_releases_the_gpu_lease_before_the_worker_exits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from carpool.core.errors import DeviceLost
    from worker.loop import loop as loop_module
    from worker.shell.bootstep import BatchLoopStep

    order: list[str] = []

    class Claimed:
        def release(self) -> None:
            order.append("gpu released")

    monkeypatch.setattr(loop_module, "exit_process", lambda exc: order.append("exit"))
    step = BatchLoopStep.__new__(BatchLoopStep)
    step.gpu = Claimed()  # type: ignore[assignment]
    step._device_lost(DeviceLost("the CUDA context is lost"))
    assert order == ["gpu released", "exit"]
