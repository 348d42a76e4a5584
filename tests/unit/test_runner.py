"""The batch runner: one result per job, in order; one bad input fails alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from carpool.core.catalogue import BinSpec, load_catalogue
from carpool.core.jobs import ClaimedJob, Outcome, with_result_json
from carpool.core.synthetic import expected_result
from worker.executors.pipelined import PipelinedExecutor
from worker.executors.runner import is_out_of_memory, isolate
from worker.handlers.base import ModelHandler
from worker.handlers.synthetic import SyntheticHandler

SPEC = load_catalogue(None).get("synthetic")
BIN = SPEC.bins[0]


def run_batch(handler: ModelHandler, bin_spec: BinSpec, jobs: Sequence[ClaimedJob],
              ) -> list[Outcome]:
    """One batch through a depth-1 executor, as a synthetic-only worker runs it."""
    executor = PipelinedExecutor()
    try:
        return executor.submit(handler, bin_spec, jobs).result()
    finally:
        executor.close()


def job(i: int, payload: Any) -> ClaimedJob:
    return ClaimedJob(f"id{i}", json.dumps(payload), admit_ms=0, attempts=1)


def test_every_job_gets_its_own_result_in_order() -> None:
    jobs = [job(i, {"value": i, "size": 1}) for i in range(5)]
    outs = run_batch(SyntheticHandler(SPEC, (0, 0)), BIN, jobs)
    assert [o.id for o in outs] == [j.id for j in jobs]
    assert [o.result for o in outs] == [expected_result({"value": i, "size": 1}) for i in range(5)]


def test_an_input_that_breaks_preprocessing_fails_alone() -> None:
    jobs = [job(0, {"value": 0, "size": 1}), job(1, "not an object"),
            job(2, {"value": 2, "size": 1})]
    outs = run_batch(SyntheticHandler(SPEC, (0, 0)), BIN, jobs)
    assert [o.failed for o in outs] == [False, True, False]
    assert outs[1].error is not None and "preprocess failed" in outs[1].error
    assert outs[2].result == expected_result({"value": 2, "size": 1})


def test_the_batchs_forward_time_is_split_equally_among_the_jobs_that_reached_the_model(
) -> None:
    jobs = [job(0, {"value": 0, "size": 1}), job(1, "not an object"),
            job(2, {"value": 2, "size": 1})]
    outs = run_batch(SyntheticHandler(SPEC, (2.0, 0)), BIN, jobs)
    assert outs[1].device_ms == 0.0  # never reached the model
    assert outs[0].device_ms == outs[2].device_ms == pytest.approx(outs[0].inference_ms / 2)
    assert outs[0].device_ms > 0


class ShortHandler(SyntheticHandler):
    """Returns one result too few: the runner must notice, not misassign."""

    def postprocess(self, output: list[dict[str, Any]], n: int) -> list[Any]:
        return list(output)[:-1]


def test_a_handler_returning_the_wrong_number_of_results_fails_the_batch_loudly() -> None:
    jobs = [job(i, {"value": i, "size": 1}) for i in range(3)]
    outs = run_batch(ShortHandler(SPEC, (0, 0)), BIN, jobs)
    assert all(o.failed and "returned 2 results for a batch of 3" in (o.error or "") for o in outs)


class CountingHandler(SyntheticHandler):
    def __init__(self) -> None:
        super().__init__(SPEC, (0, 0))
        self.collated: list[int] = []

    def collate(self, items: Sequence[dict[str, Any]], bin_spec: BinSpec) -> list[dict[str, Any]]:
        self.collated.append(len(items))
        return super().collate(items, bin_spec)


def test_failed_preprocessing_leaves_the_job_out_of_the_forward_pass() -> None:
    handler = CountingHandler()
    run_batch(handler, BIN, [job(0, {"value": 0, "size": 1}), job(1, [])])
    assert handler.collated == [1]


class PoisonHandler(SyntheticHandler):
    """Its forward pass breaks on any batch that holds the value "poison"."""

    def __init__(self) -> None:
        super().__init__(SPEC, (0, 0))
        self.forward_sizes: list[int] = []

    def forward(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.forward_sizes.append(len(batch))
        if any(item["value"] == "poison" for item in batch):
            raise ValueError("NaN in layer 3")
        return super().forward(batch)


def test_an_input_that_breaks_the_forward_pass_is_found_by_bisection_and_fails_alone() -> None:
    values: list[Any] = list(range(8))
    values[5] = "poison"
    handler = PoisonHandler()
    outs = run_batch(handler, BIN, [job(i, {"value": v, "size": 1}) for i, v in enumerate(values)])
    assert [o.failed for o in outs] == [i == 5 for i in range(8)]
    assert outs[5].error == "inference failed: ValueError: NaN in layer 3"
    assert [o.result for o in outs if not o.failed] == [
        expected_result({"value": v, "size": 1}) for v in values if v != "poison"]
    # 8 fails → 0-3 pass, 4-7 fail → 4-5 fail → 4 passes, 5 fails alone → 6-7 pass.
    assert handler.forward_sizes == [8, 4, 4, 2, 1, 1, 2]


class OutOfMemoryError(RuntimeError):
    """Named like torch's, which the runner recognises without importing torch."""


class OomHandler(SyntheticHandler):
    def forward(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(batch) > 2 or any(item["value"] == "huge" for item in batch):
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(batch)


def test_out_of_memory_splits_the_batch_and_a_job_that_cannot_fit_alone_fails_clearly() -> None:
    values: list[Any] = [0, 1, 2, "huge", 4]
    outs = run_batch(OomHandler(SPEC, (0, 0)), BIN,
                     [job(i, {"value": v, "size": 1}) for i, v in enumerate(values)])
    assert [o.failed for o in outs] == [False, False, False, True, False]
    assert "out of memory with this input alone" in (outs[3].error or "")
    assert outs[4].result == expected_result({"value": 4, "size": 1})


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"),
    RuntimeError("cuDNN Frontend error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
    RuntimeError("CUDA error: out of memory"),
])
def test_out_of_memory_is_told_by_type_and_by_the_allocation_failures_of_cuda_libraries(
        exc: BaseException) -> None:
    assert is_out_of_memory(exc)


@pytest.mark.parametrize("exc", [
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    # Not an allocation failure (docs/architecture.md): split as an error, no cap.
    RuntimeError("FIND was unable to find an engine to execute this computation"),
    ValueError("CUBLAS_STATUS_ALLOC_FAILED"),  # not what torch raises: an input's own error
    MemoryError("host memory"),
])
def test_other_errors_are_not_out_of_memory(exc: BaseException) -> None:
    assert not is_out_of_memory(exc)


class Boom(Exception):
    """An input's failure; each instance is tracked to see when it is freed."""


def test_a_failed_input_keeps_a_description_not_the_exception_while_the_rest_runs() -> None:
    import gc
    import weakref

    raised: list[weakref.ref[Boom]] = []
    alive_later: list[bool] = []

    def infer(items: Any) -> list[Any]:
        gc.collect()
        alive_later.append(any(r() is not None for r in raised))
        if 0 in items:
            exc = Boom("poison")
            raised.append(weakref.ref(exc))
            raise exc
        return list(items)

    results = isolate(infer, [0, 1, 2, 3])
    assert raised and alive_later[-1] is False, alive_later
    assert results[0].description == "Boom: poison" and results[1:] == [1, 2, 3]


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA error: device-side assert triggered"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    torch.AcceleratorError("CUDA error: unspecified launch failure"),
])
def test_a_sticky_cuda_error_is_raised_as_device_lost_without_splitting_the_batch(
        exc: BaseException) -> None:
    from carpool.core.errors import DeviceLost

    calls: list[int] = []

    def infer(items: Any) -> list[Any]:
        calls.append(len(items))
        raise exc

    with pytest.raises(DeviceLost, match="CUDA context is lost"):
        isolate(infer, [1, 2, 3, 4])
    assert calls == [4]  # no innocent half run (and failed) after it


class OddOutputHandler(SyntheticHandler):
    """Answers what its input's ``value`` names: an overflow, an object, or the usual."""

    def forward(self, batch: list[dict[str, Any]]) -> list[Any]:
        odd = {"inf": [1.0, float("inf")], "nan": {"score": float("nan")}, "set": {1, 2},
               "tensor": torch.zeros(2)}
        return [odd[item["value"]] if item["value"] in odd else out
                for item, out in zip(batch, super().forward(batch), strict=True)]


@pytest.mark.parametrize(("value", "said"), [
    ("inf", "NaN or Infinity"), ("nan", "NaN or Infinity"),
    ("set", "not JSON: TypeError: Object of type set"),
    ("tensor", "not JSON: TypeError: Object of type Tensor")])
def test_a_result_that_is_not_strict_json_fails_its_job_alone_saying_why(
        value: str, said: str) -> None:
    """RFC 8259 has no NaN or Infinity: such a result would be an answer, a webhook body
    and a batch line that strict clients refuse. (The loop encodes each outcome so, off
    the compute thread, before it writes the batch: worker/loop/loop.py.)"""
    outs = [with_result_json(o) for o in run_batch(
        OddOutputHandler(SPEC, (0, 0)), BIN,
        [job(0, {"value": 0, "size": 1}), job(1, {"value": value, "size": 1})])]
    assert [o.failed for o in outs] == [False, True]
    assert outs[1].error is not None and outs[1].error.startswith("invalid output: ")
    assert said in outs[1].error
    assert outs[0].result_json == json.dumps(expected_result({"value": 0, "size": 1}))
