"""The torch executor's GPU path on a simulated CUDA device (tests/support/simcuda.py):
copy/compute overlap read from the recorded order of copies, waits and kernels,
out-of-memory recovery, the periodic cache emptying, and batch sizes padded to the
warmed-up ladder. The memory cap the loop claims with, against Redis:
tests/redis/test_torch_executor_simgpu.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.jobs import ClaimedJob
from carpool.core.settings import ExecutorSettings
from tests.support.simcuda import MIB, SimCuda, SimHandler
from worker.executors.ladder import rungs
from worker.executors.torch_executor import TorchExecutor

torch.set_num_threads(1)
#: A bound on any wait here; reaching it is a failure, not a timing.
TIMEOUT_S = 30.0
BIN = BinSpec("only", max_size=10, max_batch=4, max_wait_ms=0, max_depth=100)
SPEC = ModelSpec("sim", "sim", "size", (BIN,))
KEY = ("sim", "only")


def jobs(xs: Sequence[float], start: int = 0) -> list[ClaimedJob]:
    return [ClaimedJob(f"j{start + i}", json.dumps({"x": x}), admit_ms=0, attempts=1)
            for i, x in enumerate(xs)]


def executor(sim: SimCuda, **settings: Any) -> TorchExecutor:
    opts: dict[str, Any] = {"device": "cuda", "torch_threads": 0, "empty_cache_every": 0,
                            **settings}
    return TorchExecutor(ExecutorSettings(**opts), sim)


def ys(outcomes: Sequence[Any]) -> list[Any]:
    return [o.result for o in outcomes]


def index(log: list[tuple[Any, ...]], match: Any) -> int:
    """Where the first entry ``match`` accepts is in the log."""
    return next(i for i, e in enumerate(log) if match(e))


def test_batch_2_is_copied_in_before_batch_1_computes_and_each_kernel_waits_for_its_copy(
) -> None:
    sim = SimCuda(1 << 30)
    handler = SimHandler(sim, SPEC)
    handler.gate = threading.Event()  # batch 1's forward waits until batch 2 is submitted
    ex = executor(sim)
    first = ex.submit(handler, BIN, jobs([1.0, 2.0]))
    second = ex.submit(handler, BIN, jobs([3.0, 4.0], start=2))
    handler.gate.set()
    outs = [f.result(TIMEOUT_S) for f in (first, second)]
    ex.close()
    assert ys(outs[0]) == [{"y": 3.0}, {"y": 5.0}] and ys(outs[1]) == [{"y": 7.0}, {"y": 9.0}]
    assert handler.gate_opened == [True], "submit did not return before batch 1 computed"
    log = sim.log
    copies = sim.ops("h2d")
    kernels = sim.ops("kernel")
    assert [c[2] for c in copies] == [1, 2] and [k[4] for k in kernels] == [1, 2]
    copy_stream, compute_stream = copies[0][1], kernels[0][1]
    assert copy_stream != compute_stream
    # The overlap: batch 2's copy was issued before batch 1's kernel.
    assert index(log, lambda e: e[:3] == ("h2d", copy_stream, 2)) < index(
        log, lambda e: e[0] == "kernel")
    # Each kernel's stream first waited for an event recorded after its batch's copy.
    recorded = {e[2]: i for i, e in enumerate(log) if e[:2] == ("record", copy_stream)}
    for copy, kernel in zip(copies, kernels, strict=True):
        waits = [i for i, e in enumerate(log[:log.index(kernel)])
                 if e[:2] == ("wait", compute_stream) and recorded[e[2]] > log.index(copy)]
        assert waits, (copy, kernel, log)
    assert sim.hazards == []


def test_out_of_memory_empties_the_cache_before_the_halves_run_and_caps_the_bin() -> None:
    sim = SimCuda(64 * MIB)
    handler = SimHandler(sim, SPEC, bytes_per_item=20 * MIB)  # 4 rows: 80 MiB; 2: 40
    ex = executor(sim)
    outs = ex.submit(handler, BIN, jobs([1.0, 2.0, 3.0, 4.0])).result(TIMEOUT_S)
    ex.close()
    assert ys(outs) == [{"y": 2.0 * x + 1} for x in (1, 2, 3, 4)]
    log = sim.log
    oom = index(log, lambda e: e[0] == "oom")
    first_half = index(log, lambda e: e[0] == "kernel")
    assert [k[3] for k in sim.ops("kernel")] == [2, 2]
    assert oom < index(log, lambda e: e == ("empty_cache",)) < first_half
    assert ex.guard.cap(KEY) == 2 and ex.stats.oom_splits == 1


def test_the_cache_is_emptied_every_n_batches_between_batches_only() -> None:
    sim = SimCuda(1 << 30)
    handler = SimHandler(sim, SPEC)
    ex = executor(sim, empty_cache_every=2)
    for k in range(4):
        ex.submit(handler, BIN, jobs([float(k)] * 2, start=2 * k)).result(TIMEOUT_S)
    ex.close()
    marks = [e[0] for e in sim.log if e[0] in ("kernel", "empty_cache")]
    assert marks == ["kernel", "kernel", "empty_cache", "kernel", "kernel", "empty_cache"]
    assert ex.guard.empty_cache_calls == 2


def test_a_batch_staged_before_an_out_of_memory_error_is_split_before_it_runs() -> None:
    sim = SimCuda(64 * MIB)
    handler = SimHandler(sim, SPEC, bytes_per_item=20 * MIB)
    handler.gate = threading.Event()
    ex = executor(sim)
    first = ex.submit(handler, BIN, jobs([1.0] * 4))
    second = ex.submit(handler, BIN, jobs([2.0] * 4, start=4))  # staged at 4, as claimed
    handler.gate.set()
    outs = [f.result(TIMEOUT_S) for f in (first, second)]
    ex.close()
    assert handler.gate_opened == [True]
    assert ys(outs[1]) == [{"y": 5.0}] * 4
    assert [k[3] for k in sim.ops("kernel")] == [2, 2, 2, 2]
    assert len(sim.ops("oom")) == 1, "the staged batch met a second out-of-memory error"


@pytest.mark.parametrize("message", [
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
])
def test_allocation_failures_of_cublas_and_cudnn_shrink_the_bin_like_out_of_memory(
        message: str) -> None:
    sim = SimCuda(1 << 30)
    handler = SimHandler(sim, SPEC)
    handler.fail_over, handler.failure = 2, RuntimeError(message)
    ex = executor(sim)
    outs = ex.submit(handler, BIN, jobs([1.0, 2.0, 3.0, 4.0])).result(TIMEOUT_S)
    ex.close()
    assert ys(outs) == [{"y": 2.0 * x + 1} for x in (1, 2, 3, 4)]
    assert ex.stats.oom_splits == 1 and ex.stats.error_splits == 0
    assert ex.guard.cap(KEY) == 2
    assert sim.ops("empty_cache") == [("empty_cache",)]


def test_every_batch_size_runs_padded_to_a_rung_of_the_ladder_and_results_are_cut_back(
) -> None:
    big = BinSpec("big", max_size=10, max_batch=12, max_wait_ms=0, max_depth=100)
    spec = ModelSpec("sim", "sim", "size", (big,))
    sim = SimCuda(1 << 30)
    handler = SimHandler(sim, spec)
    ex = executor(sim)
    for n in range(1, 13):
        outs = ex.submit(handler, big, jobs([float(n)] * n)).result(TIMEOUT_S)
        assert ys(outs) == [{"y": 2.0 * n + 1}] * n
    ex.close()
    ran = {k[3] for k in sim.ops("kernel")}
    assert ran <= set(rungs(12)), ran  # what warm-up runs: cuDNN never autotunes mid-serving
    assert sim.hazards == []


def test_a_memory_cap_between_rungs_is_snapped_down_to_a_warmed_up_rung() -> None:
    ex = executor(SimCuda(1 << 30))
    ex.guard.on_out_of_memory(("sim", "big"), 80)  # a learned ceiling of 40
    assert ex.guard.cap(("sim", "big")) == 40
    assert ex.limit("sim", "big", 64) == 32 and ex.view_limit("sim", "big", 64) == 32
    assert ex.limit("sim", "big", 64) in rungs(64)
    ex.close()


def test_metrics_reading_the_limits_never_move_the_memory_guard() -> None:
    from carpool.core.settings import load_settings
    from tests.conftest import make_env
    from tests.support.simcuda import SimHandler as Handler
    from worker.loop.loop import BatchLoop

    sim = SimCuda(1 << 30)
    sim.external_bytes = sim.capacity_bytes - 16 * MIB  # a dip: far below the watermark
    ex = executor(sim)
    settings = load_settings(make_env("redis://127.0.0.1:1/0", "unused"))
    spec = settings.catalogue.get("synthetic")
    loop = BatchLoop(settings, None, {"synthetic": Handler(sim, spec)}, "w",  # type: ignore[arg-type]
                     executor=ex)
    before = {k: v.max_batch for k, v in loop.live_limits().items()}
    for _ in range(4):  # four Prometheus scrapes during the dip
        assert {k: v.max_batch for k, v in loop.live_limits().items()} == before
    assert ex.guard.shrinks_total == 0 and ex.guard.memory_caps == {}
    ex.close()


class ThreadNoting(SimHandler):
    """Notes the thread of every forward pass, and whether an exception is being handled
    when the executor frees memory."""

    threads: list[str]

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.threads.append(threading.current_thread().name)
        return super().forward(batch)


def test_warm_up_and_calibration_run_on_the_compute_thread_that_serves() -> None:
    from worker.observe.calibrate import calibrate, warm_up

    sim = SimCuda(1 << 30)
    handler = ThreadNoting(sim, SPEC)
    handler.threads = []
    ex = executor(sim)
    calibrate(ex, handler, reps=1, sizes=[1, 2])
    warm_up(ex, handler)
    ex.submit(handler, BIN, jobs([1.0])).result(TIMEOUT_S)
    ex.close()
    assert handler.threads and set(handler.threads) == {handler.threads[-1]}, handler.threads
    assert handler.threads[-1].startswith("carpool-compute")


def test_calibration_frees_memory_after_the_failed_probes_except_block() -> None:
    import sys

    from worker.observe.calibrate import calibrate

    sim = SimCuda(64 * MIB)
    handler = SimHandler(sim, SPEC, bytes_per_item=20 * MIB)  # batch 4 runs out of memory
    ex = executor(sim)
    handling: list[bool] = []
    ex.release = lambda: handling.append(sys.exc_info()[0] is not None)  # type: ignore[method-assign]
    profile = calibrate(ex, handler, reps=1, sizes=[1, 2, 4])
    ex.close()
    assert profile.bins["only"].out_of_memory_at == 4
    assert handling == [False], "released inside the except block: its frames still pinned"


class DownloadsAsync(SimHandler):
    """Returns its output as a non_blocking device-to-host copy, as a handler may."""

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return self.sim.download_async(super().forward(batch))


def test_a_non_blocking_copy_to_the_host_has_landed_before_postprocess_reads_it() -> None:
    sim = SimCuda(1 << 30)
    ex = executor(sim)
    outs = ex.submit(DownloadsAsync(sim, SPEC), BIN, jobs([1.0, 2.0])).result(TIMEOUT_S)
    ex.close()
    assert ys(outs) == [{"y": 3.0}, {"y": 5.0}]


def test_a_sticky_cuda_error_in_calibration_fails_the_start_instead_of_capping_the_bin(
) -> None:
    from worker.observe.calibrate import calibrate

    sim = SimCuda(1 << 30)
    handler = SimHandler(sim, SPEC)
    handler.fail_over = 1
    handler.failure = RuntimeError("CUDA error: an illegal memory access was encountered")
    ex = executor(sim)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        calibrate(ex, handler, reps=1, sizes=[1, 2, 4])
    ex.close()
