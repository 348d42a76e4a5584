"""The torch executor on the CPU, driven through the real batching loop and Redis:
one result per job in order, two batches in flight, poison inputs and
out-of-memory errors isolated."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from carpool.backend.queue import Queue
from carpool.core.catalogue import BinSpec, ModelSpec, load_catalogue
from carpool.core.jobs import JobStatus
from carpool.core.settings import ExecutorSettings, Settings
from tests.support.jobs import admit
from tests.support.observed import Recorder
from worker.device.memory import MemoryGuard
from worker.executors.torch_executor import TorchExecutor
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.loop import BatchLoop

torch.set_num_threads(1)
#: A bound on any wait in these tests; reaching it is a failure, not a timing.
TIMEOUT_S = 30.0
#: How long batch 1's forward waits for batch 2's preprocessing: without the
#: pipeline it never comes, and the test fails after this.
RELEASE_TIMEOUT_S = 5.0
BIN = BinSpec("only", max_size=10, max_batch=4, max_wait_ms=0, max_depth=100)
SPEC = ModelSpec("tiny", "tiny", "size", (BIN,))


class TinyHandler:
    """y = 2x + 1 as a torch model; "poison" breaks the forward pass of its batch."""

    def __init__(self) -> None:
        self.spec = SPEC
        self.forward_sizes: list[int] = []
        self.oom_over: int | None = None  # batches larger than this "run out of memory"
        #: The pipeline test holds batch 1's forward until batch 2 was preprocessed;
        #: whether that came within the bound is recorded here, for the test to assert
        #: (an assertion inside forward would be taken for a bad input and split away).
        self.release_forward: threading.Event | None = None
        self.released_in_time: list[bool] = []

    def load(self) -> None:
        return None

    def preprocess(self, job_input: Any) -> torch.Tensor:
        if job_input["x"] == "bad":
            raise ValueError("not a number")
        poison = job_input["x"] == "poison"
        return torch.tensor([float("nan") if poison else float(job_input["x"])])

    def collate(self, items: Sequence[torch.Tensor], bin_spec: BinSpec) -> torch.Tensor:
        return torch.stack(list(items))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.forward_sizes.append(len(batch))
        if self.release_forward is not None and len(self.forward_sizes) == 1:
            self.released_in_time.append(self.release_forward.wait(RELEASE_TIMEOUT_S))
        if self.oom_over is not None and len(batch) > self.oom_over:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        if torch.isnan(batch).any():
            raise RuntimeError("NaN input")
        return batch * 2 + 1

    def postprocess(self, output: torch.Tensor, n: int) -> list[Any]:
        return [{"y": float(v)} for v in output[:, 0]]


def admit_each(queue: Queue, xs: Sequence[Any]) -> list[str]:
    """One job per x, its input ``{"x": x}``."""
    return [admit(queue, SPEC, body=json.dumps({"x": x})) for x in xs]


def make_loop(settings: Settings, queue: Queue, handler: TinyHandler,
              guard: MemoryGuard | None = None) -> tuple[BatchLoop, TorchExecutor]:
    executor = TorchExecutor(ExecutorSettings(device="cpu", preprocess_threads=2), "cpu",
                             guard=guard)
    loop = BatchLoop(settings, queue, {"tiny": handler}, "w-test", executor=executor)  # type: ignore[dict-item]
    return loop, executor


def serve_until_done(loop: BatchLoop, queue: Queue, ids: list[str]) -> None:
    for _ in range(200):  # bounded: each step claims, completes or waits ≤ 1 s
        views = [queue.get(i) for i in ids]
        if all(v is not None and v.status.is_final for v in views):
            loop.drain()
            return
        loop.step()
    pytest.fail("jobs did not finish")


def results(queue: Queue, ids: list[str]) -> list[Any]:
    views = [queue.get(i) for i in ids]
    return [(v.status, v.result if v.status is JobStatus.DONE else v.error)
            for v in views if v is not None]


def test_every_job_gets_its_own_result_in_order_through_the_pipeline(
        settings: Settings, queue: Queue) -> None:
    handler = TinyHandler()
    loop, executor = make_loop(settings, queue, handler)
    ids = admit_each(queue, range(10))
    serve_until_done(loop, queue, ids)
    executor.close()
    assert results(queue, ids) == [(JobStatus.DONE, {"y": 2.0 * x + 1}) for x in range(10)]
    assert handler.forward_sizes == [4, 4, 2]


def test_batch_n_plus_1_is_claimed_and_preprocessed_while_batch_n_computes(
        settings: Settings, queue: Queue) -> None:
    handler = TinyHandler()
    handler.release_forward = threading.Event()
    loop, executor = make_loop(settings, queue, handler)
    preprocess = handler.preprocess

    def preprocess_then_release(job_input: Any) -> torch.Tensor:
        item = preprocess(job_input)
        if job_input["x"] >= 4:  # batch 2's inputs
            assert handler.release_forward is not None
            handler.release_forward.set()
        return item

    handler.preprocess = preprocess_then_release  # type: ignore[method-assign]
    ids = admit_each(queue, range(8))
    # Batch 1's forward waits until batch 2 was preprocessed: without the pipeline
    # that never happens, and the bounded wait ends unreleased.
    serve_until_done(loop, queue, ids)
    executor.close()
    assert handler.released_in_time == [True], "batch 2 was not preprocessed during batch 1"
    assert [s for s, _ in results(queue, ids)] == [JobStatus.DONE] * 8


def test_hooks_hear_claimed_and_finished_for_every_claim_in_order(
        settings: Settings, queue: Queue) -> None:
    heard = Recorder()
    loop, executor = make_loop(settings, queue, TinyHandler())
    loop.observers.append(heard)
    ids = admit_each(queue, range(9))
    serve_until_done(loop, queue, ids)
    executor.close()
    tokens = heard.tokens("claimed")
    assert heard.tokens("finished") == tokens
    assert len(tokens) == 3 and sum(r.size for r in heard.reports()) == 9
    # Pipelined: batch 2 starts before batch 1 finishes.
    assert heard.events()[:3] == ["claimed", "claimed", "finished"]


def test_a_poison_input_fails_alone_and_a_bad_input_fails_in_preprocessing(
        settings: Settings, queue: Queue) -> None:
    loop, executor = make_loop(settings, queue, TinyHandler())
    ids = admit_each(queue, [0, 1, "poison", 3, "bad", 5])
    serve_until_done(loop, queue, ids)
    executor.close()
    got = results(queue, ids)
    assert got[2] == (JobStatus.FAILED, "inference failed: RuntimeError: NaN input")
    assert got[4][0] is JobStatus.FAILED and "preprocess failed" in got[4][1]
    assert [r for i, r in enumerate(got) if i not in (2, 4)] == [
        (JobStatus.DONE, {"y": 2.0 * x + 1}) for x in (0, 1, 3, 5)]
    assert executor.stats.error_splits >= 1


def test_out_of_memory_splits_the_batch_and_shrinks_the_bins_limit(
        settings: Settings, queue: Queue) -> None:
    handler = TinyHandler()
    handler.oom_over = 1
    guard = MemoryGuard(None)
    loop, executor = make_loop(settings, queue, handler, guard)
    ids = admit_each(queue, range(4))
    serve_until_done(loop, queue, ids)
    executor.close()
    assert results(queue, ids) == [(JobStatus.DONE, {"y": 2.0 * x + 1}) for x in range(4)]
    # 4 and its first half fail; the second half is not tried at 2 again, the size
    # that just failed, but run in parts of the new cap.
    assert handler.forward_sizes == [4, 2, 1, 1, 1, 1]
    assert executor.stats.oom_splits == 2 and guard.shrinks_total == 2


def test_padding_waste_is_counted_when_the_torch_executor_stages_a_batch() -> None:
    executor = TorchExecutor(ExecutorSettings(device="cpu"), "cpu")
    spec = load_catalogue(None).get("synthetic")
    items = [{"value": i, "size": size} for i, size in enumerate((16, 48, 32))]
    executor.stage(SyntheticHandler(spec, (0, 0)), items, spec.bin_named("small"))
    executor.close()
    # Sizes 16, 48, 32 padded to the bin's 64: half of the batch is padding.
    assert executor.stats.padding_waste[("synthetic", "small")] == pytest.approx(0.5)
