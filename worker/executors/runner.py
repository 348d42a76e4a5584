"""The torch-free steps of running a claimed batch: one bad input fails alone.

claim → run → record are three steps; these are the middle one's parts, shared
by every executor (``worker.executors.pipelined``), and know nothing of Redis
(nor of torch). Every job of the batch gets exactly one
Outcome, in order. A preprocessing error fails its own job; a forward error
splits the batch in halves and retries each, until the input that causes it
stands alone — so one poison input costs about 2·log2(n) extra forward passes
and fails only itself. An out-of-memory error is split the same way.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from carpool.core.errors import DeviceLost, HandlerContractError
from carpool.core.jobs import ClaimedJob, Outcome
from worker.handlers.base import ModelHandler

log = logging.getLogger(__name__)

#: Runs collate → forward → postprocess on some items; one result per item.
InferFn = Callable[[Sequence[Any]], list[Any]]
#: Told of every failed (sub-)batch before it is split: the exception and its size.
SplitHook = Callable[[BaseException, int], None]
#: Maps preprocessing over inputs, keeping order (a thread pool's ``map``).
Mapper = Callable[[Callable[[str], Any], Iterable[str]], Iterator[Any]]


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


#: What a handler may raise for an input or a batch: anything. Not only errors: a
#: ``sys.exit()`` raises SystemExit, a model running an event loop inside may let
#: ``asyncio.CancelledError`` out (a BaseException). On the compute or the loop's
#: thread none ends the process (KeyboardInterrupt comes to the main thread only);
#: uncaught, each ended the batch loop's thread silently, leaving a worker that
#: heartbeats and serves nothing while the model's jobs stay queued.
HANDLER_ERRORS = (BaseException,)


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when that raises. A handler's error may not say what
    it is (some C extensions' cannot): the raise escaped the batch's isolation, and the
    loop handed the batch back, its job retried for ever, ``queued`` to its client."""
    try:
        return str(exc)
    except Exception as inner:  # noqa: BLE001 — whatever it raised, the job fails alone
        return f"(its message could not be read: {type(inner).__name__})"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"the handler called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {message_of(exc)}"


#: Allocation failures that CUDA libraries raise as a plain RuntimeError, not as
#: torch's OutOfMemoryError: cuBLAS cannot create its handle or workspace, cuDNN 9
#: cannot allocate host or device memory (its ``CUDNN_STATUS_ALLOC_FAILED`` is a
#: deprecated alias that cuDNN 9 never emits, and ``NOT_ENOUGH_WORKSPACE`` is gone),
#: a kernel launch finds no memory. Each is the device being out of memory, and the
#: batch is split and the bin shrunk for it. cuDNN's "unable to find an engine" is
#: not among them (docs/architecture.md, "Out of memory"): it is split as an error.
ALLOCATION_FAILURES = (
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "CUDA error: out of memory",
    "CUDA out of memory",
)

#: CUDA errors that corrupt the context ("sticky"): every later CUDA call in this
#: process fails too, so splitting the batch would fail innocent jobs and the worker
#: would fail every batch after. torch raises them as ``torch.AcceleratorError``
#: (2.8 on) or as a RuntimeError carrying CUDA's message.
STICKY_CUDA_ERRORS = (
    "device-side assert triggered",
    "an illegal memory access was encountered",
    "illegal instruction",
    "misaligned address",
    "unspecified launch failure",
)


def is_sticky(exc: BaseException) -> bool:
    """True for an error after which this process's CUDA context is unusable."""
    torch = sys.modules.get("torch")
    accelerator_error = getattr(torch, "AcceleratorError", None) if torch else None
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and any(m in message_of(exc) for m in STICKY_CUDA_ERRORS)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch's out-of-memory error (by type) and for the allocation failures
    of cuBLAS and cuDNN, which torch raises as a RuntimeError. Torch is looked up,
    not imported: the synthetic model's worker runs without it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(
        m in message_of(exc) for m in ALLOCATION_FAILURES)


class _Failed:
    """Stands in a result list for an item that raised: a description, never the
    exception, whose traceback pins the failed pass's frames and tensors (device
    memory, on a GPU) while the rest of the batch runs."""

    def __init__(self, exc: BaseException) -> None:
        self.description = _describe(exc)
        self.out_of_memory = is_out_of_memory(exc)


def preprocess_all(
    handler: ModelHandler, jobs: Sequence[ClaimedJob], mapper: Mapper = map,
) -> tuple[list[tuple[ClaimedJob, Any]], list[Outcome], float]:
    """Items that preprocessed, outcomes for those that did not, and the time spent."""

    def one(input_json: str) -> Any:
        try:
            return handler.preprocess(json.loads(input_json))
        except HANDLER_ERRORS as exc:  # any input error fails this job only
            return _Failed(exc)

    t0 = time.perf_counter()
    ready: list[tuple[ClaimedJob, Any]] = []
    failed: list[Outcome] = []
    for job, item in zip(jobs, mapper(one, [j.input_json for j in jobs]), strict=True):
        if isinstance(item, _Failed):
            failed.append(Outcome(job.id, error=f"preprocess failed: {item.description}"))
        else:
            ready.append((job, item))
    return ready, failed, _ms_since(t0)


def checked(handler: ModelHandler, results: list[Any], n: int) -> list[Any]:
    """``results``, if there is exactly one per item; else a loud contract error."""
    if len(results) != n:
        raise HandlerContractError(
            f"handler for {handler.spec.name!r} returned {len(results)} results "
            f"for a batch of {n}"
        )
    return results


def isolate(infer_fn: InferFn, items: Sequence[Any], on_split: SplitHook | None = None,
            ) -> list[Any]:
    """One result per item, or a ``_Failed`` for each item that fails even alone.

    A handler that breaks its contract is a bug in the handler, not in an input:
    splitting would only hide it, so the whole batch fails with it.
    """
    try:
        return infer_fn(items)
    except HandlerContractError as exc:
        return [_Failed(exc)] * len(items)
    except HANDLER_ERRORS as exc:  # find the input that causes it
        if is_sticky(exc):  # every later call fails too: no input is to blame yet
            raise DeviceLost(f"the CUDA context is lost: {_describe(exc)}") from None
        if len(items) == 1:
            return [_Failed(exc)]
        if on_split is not None:
            on_split(exc, len(items))
        half = len(items) // 2
        log.warning("batch of %d failed (%s); retrying as %d + %d", len(items),
                    _describe(exc), half, len(items) - half)
    return isolate(infer_fn, items[:half], on_split) + isolate(infer_fn, items[half:], on_split)


def failure_message(failed: _Failed) -> str:
    if failed.out_of_memory:
        return ("inference failed: out of memory with this input alone in its batch; "
                f"it cannot fit on this device ({failed.description})")
    return f"inference failed: {failed.description}"


def outcomes(
    jobs: Sequence[ClaimedJob], ready: Sequence[tuple[ClaimedJob, Any]],
    failed: Sequence[Outcome], results: Sequence[Any], pre_ms: float, inf_ms: float,
) -> list[Outcome]:
    """One Outcome per job, in the order of ``jobs``. Each job that reached the model
    gets an equal share of ``inf_ms`` as its ``device_ms``: every input of a bin is
    padded to the bin's ``max_size``, so each holds an equal part of the padded batch
    (padding rows, and an input that failed in the model, cost their batch too)."""
    by_id: dict[str, Outcome] = {o.id: o for o in failed}
    share_ms = inf_ms / len(ready) if ready else 0.0
    for (job, _), result in zip(ready, results, strict=True):
        if isinstance(result, _Failed):
            by_id[job.id] = Outcome(job.id, error=failure_message(result),
                                    preprocess_ms=pre_ms, device_ms=share_ms)
        else:
            by_id[job.id] = Outcome(job.id, result=result, preprocess_ms=pre_ms,
                                    inference_ms=inf_ms, device_ms=share_ms)
    return [by_id[job.id] for job in jobs]
