"""Run one claimed batch through a handler: one bad input fails alone.

claim → run → record are three steps; this module is the middle one and knows
nothing of Redis. Every job of the batch gets exactly one Outcome, in order.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from carpool.catalogue import BinSpec
from carpool.errors import HandlerContractError
from carpool.jobs import ClaimedJob, Outcome
from worker.handlers.base import ModelHandler

log = logging.getLogger(__name__)


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def preprocess_all(
    handler: ModelHandler, jobs: Sequence[ClaimedJob]
) -> tuple[list[tuple[ClaimedJob, Any]], list[Outcome], float]:
    """Items that preprocessed, outcomes for those that did not, and the time spent."""
    t0 = time.perf_counter()
    ready: list[tuple[ClaimedJob, Any]] = []
    failed: list[Outcome] = []
    for job in jobs:
        try:
            ready.append((job, handler.preprocess(json.loads(job.input_json))))
        except Exception as exc:  # noqa: BLE001 — any input error fails this job only
            failed.append(Outcome(job.id, error=f"preprocess failed: {_describe(exc)}"))
    return ready, failed, _ms_since(t0)


def infer(handler: ModelHandler, items: Sequence[Any], bin_spec: BinSpec) -> list[Any]:
    """collate → forward → postprocess, checked to give one result per item."""
    output = handler.forward(handler.collate(items, bin_spec))
    results = handler.postprocess(output, len(items))
    if len(results) != len(items):
        raise HandlerContractError(
            f"handler for {handler.spec.name!r} returned {len(results)} results "
            f"for a batch of {len(items)}"
        )
    return results


def run_batch(
    handler: ModelHandler, bin_spec: BinSpec, jobs: Sequence[ClaimedJob]
) -> list[Outcome]:
    """One Outcome per job, in the order of ``jobs``."""
    ready, failed, pre_ms = preprocess_all(handler, jobs)
    by_id: dict[str, Outcome] = {o.id: o for o in failed}
    if ready:
        t0 = time.perf_counter()
        try:
            results = infer(handler, [item for _, item in ready], bin_spec)
            inf_ms = _ms_since(t0)
            for (job, _), result in zip(ready, results, strict=True):
                by_id[job.id] = Outcome(job.id, result=result, preprocess_ms=pre_ms,
                                        inference_ms=inf_ms)
        except Exception as exc:  # noqa: BLE001 — the batch fails, the worker lives on
            log.exception("batch of %d for %s failed", len(ready), handler.spec.name)
            for job, _ in ready:
                by_id[job.id] = Outcome(job.id, error=f"inference failed: {_describe(exc)}",
                                        preprocess_ms=pre_ms)
    return [by_id[job.id] for job in jobs]
