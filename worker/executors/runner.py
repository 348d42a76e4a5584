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

from carpool.core.errors import HandlerContractError
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


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


#: Allocation failures that CUDA libraries raise as a plain RuntimeError, not as
#: torch's OutOfMemoryError: cuBLAS cannot create its handle or workspace, cuDNN
#: cannot allocate its workspace, a kernel launch finds no memory. Each is the
#: device being out of memory, and the batch is split and the bin shrunk for it.
ALLOCATION_FAILURES = (
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "CUDA error: out of memory",
    "CUDA out of memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch's out-of-memory error (by type) and for the allocation failures
    of cuBLAS and cuDNN, which torch raises as a RuntimeError. Torch is looked up,
    not imported: the synthetic model's worker runs without it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in ALLOCATION_FAILURES)


class _Failed:
    """Stands in a result list for an item that raised."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def preprocess_all(
    handler: ModelHandler, jobs: Sequence[ClaimedJob], mapper: Mapper = map,
) -> tuple[list[tuple[ClaimedJob, Any]], list[Outcome], float]:
    """Items that preprocessed, outcomes for those that did not, and the time spent."""

    def one(input_json: str) -> Any:
        try:
            return handler.preprocess(json.loads(input_json))
        except Exception as exc:  # noqa: BLE001 — any input error fails this job only
            return _Failed(exc)

    t0 = time.perf_counter()
    ready: list[tuple[ClaimedJob, Any]] = []
    failed: list[Outcome] = []
    for job, item in zip(jobs, mapper(one, [j.input_json for j in jobs]), strict=True):
        if isinstance(item, _Failed):
            failed.append(Outcome(job.id, error=f"preprocess failed: {_describe(item.exc)}"))
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
    except Exception as exc:  # noqa: BLE001 — find the input that causes it
        if len(items) == 1:
            return [_Failed(exc)]
        if on_split is not None:
            on_split(exc, len(items))
        half = len(items) // 2
        log.warning("batch of %d failed (%s); retrying as %d + %d", len(items),
                    _describe(exc), half, len(items) - half)
    return isolate(infer_fn, items[:half], on_split) + isolate(infer_fn, items[half:], on_split)


def failure_message(exc: BaseException) -> str:
    if is_out_of_memory(exc):
        return ("inference failed: out of memory with this input alone in its batch; "
                f"it cannot fit on this device ({_describe(exc)})")
    return f"inference failed: {_describe(exc)}"


def outcomes(
    jobs: Sequence[ClaimedJob], ready: Sequence[tuple[ClaimedJob, Any]],
    failed: Sequence[Outcome], results: Sequence[Any], pre_ms: float, inf_ms: float,
) -> list[Outcome]:
    """One Outcome per job, in the order of ``jobs``."""
    by_id: dict[str, Outcome] = {o.id: o for o in failed}
    for (job, _), result in zip(ready, results, strict=True):
        if isinstance(result, _Failed):
            by_id[job.id] = Outcome(job.id, error=failure_message(result.exc),
                                    preprocess_ms=pre_ms)
        else:
            by_id[job.id] = Outcome(job.id, result=result, preprocess_ms=pre_ms,
                                    inference_ms=inf_ms)
    return [by_id[job.id] for job in jobs]
