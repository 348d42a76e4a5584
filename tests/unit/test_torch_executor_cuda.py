"""GPU behaviour of the executor, on a real CUDA device (skipped without one):
the copy of batch N+1 overlaps the compute of batch N, pinned buffers are
reused, and a real out-of-memory error is split and survived."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.jobs import ClaimedJob
from carpool.core.settings import ExecutorSettings
from worker.executors.torch_executor import TorchExecutor

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TIMEOUT_S = 120.0
BIN = BinSpec("only", max_size=10, max_batch=8, max_wait_ms=0, max_depth=100)
SPEC = ModelSpec("gpu-test", "test", "size", (BIN,))
#: Floats per item: 4 M floats = 16 MiB, so a batch of 4 copies 64 MiB.
ITEM_FLOATS = 4 << 20


class HeavyHandler:
    """Items of ``ITEM_FLOATS`` floats; a forward pass of many large matmuls, so that
    one batch computes for far longer than the next one takes to copy in."""

    def __init__(self, matmuls: int = 20, side: int = 8192) -> None:
        self.spec = SPEC
        self.matmuls = matmuls
        self.weight = torch.randn(side, side, device="cuda") / side**0.5
        #: Bytes a batch allocates per item in forward (the OOM test sets it).
        self.bytes_per_item = 0

    def load(self) -> None:
        return None

    def preprocess(self, job_input: Any) -> torch.Tensor:
        return torch.full((ITEM_FLOATS,), float(job_input["x"]))

    def collate(self, items: Sequence[torch.Tensor], bin_spec: BinSpec) -> torch.Tensor:
        return torch.stack(list(items))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if self.bytes_per_item:
            scratch = torch.empty(len(batch) * self.bytes_per_item // 4, device=batch.device)
            scratch.fill_(1.0)
            del scratch
        h = self.weight
        for _ in range(self.matmuls):
            h = torch.tanh(h @ self.weight)
        return batch.mean(dim=1) + h.mean() * 0

    def postprocess(self, output: torch.Tensor, n: int) -> list[Any]:
        return [{"mean": float(v)} for v in output]


def jobs(xs: Sequence[float], start: int = 0) -> list[ClaimedJob]:
    return [ClaimedJob(f"j{start + i}", json.dumps({"x": x}), admit_ms=0, attempts=1)
            for i, x in enumerate(xs)]


def executor() -> TorchExecutor:
    return TorchExecutor(ExecutorSettings(device="cuda", torch_threads=0), "cuda")


def test_the_copy_of_batch_n_plus_1_overlaps_the_compute_of_batch_n() -> None:
    ex = executor()
    handler = HeavyHandler()
    ex.submit(handler, BIN, jobs([1.0] * 4)).result(TIMEOUT_S)  # warm-up: cuBLAS, allocator
    ex.trace = []
    first = ex.submit(handler, BIN, jobs([2.0] * 4))
    second = ex.submit(handler, BIN, jobs([3.0] * 4, start=4))
    outs = [f.result(TIMEOUT_S) for f in (first, second)]
    torch.cuda.synchronize()
    ex.close()
    assert [o.result for o in outs[1]] == [{"mean": 3.0}] * 4
    events: dict[str, list[torch.cuda.Event]] = {}
    for name, event in ex.trace:
        events.setdefault(name, []).append(event)
    base = events["compute_start"][0]
    compute_end_1 = base.elapsed_time(events["compute_end"][0])
    copy_start_2 = base.elapsed_time(events["copy_start"][1])
    copy_end_2 = base.elapsed_time(events["copy_end"][1])
    # Batch 2's 64 MiB crossed to the device while batch 1 was still computing.
    assert copy_start_2 < compute_end_1 and copy_end_2 < compute_end_1, (
        copy_start_2, copy_end_2, compute_end_1)
    assert base.elapsed_time(events["compute_start"][1]) >= compute_end_1


def test_pinned_buffers_are_allocated_once_per_shape_and_reused() -> None:
    ex = executor()
    handler = HeavyHandler(matmuls=1, side=256)
    for k in range(6):
        outs = ex.submit(handler, BIN, jobs([float(k)] * 4, start=4 * k)).result(TIMEOUT_S)
        assert [o.result for o in outs] == [{"mean": float(k)}] * 4
    ex.close()
    assert ex.staging.pinned_allocations == 2  # double-buffered, never re-pinned


def test_a_real_out_of_memory_error_splits_the_batch_and_an_item_too_big_fails_alone() -> None:
    ex = executor()
    handler = HeavyHandler(matmuls=1, side=256)
    free, _ = torch.cuda.mem_get_info()
    handler.bytes_per_item = int(free * 0.4)  # 4 items: 160 % of free memory; 2 items: 80 %
    outs = ex.submit(handler, BIN, jobs([1.0, 2.0, 3.0, 4.0])).result(TIMEOUT_S)
    assert [o.result for o in outs] == [{"mean": x} for x in (1.0, 2.0, 3.0, 4.0)]
    assert ex.stats.oom_splits >= 1 and ex.guard.shrinks_total >= 1
    assert ex.guard.limits[("gpu-test", "only")] <= 2
    handler.bytes_per_item = int(free * 1.5)  # one item alone cannot fit
    outs = ex.submit(handler, BIN, jobs([5.0], start=10)).result(TIMEOUT_S)
    assert outs[0].failed and "out of memory with this input alone" in (outs[0].error or "")
    handler.bytes_per_item = 0
    outs = ex.submit(handler, BIN, jobs([6.0, 7.0], start=20)).result(TIMEOUT_S)
    ex.close()
    assert [o.result for o in outs] == [{"mean": 6.0}, {"mean": 7.0}]  # the worker lives on
