"""What the batching loop asks of an executor, and the torch-free default.

The loop claims a batch, hands it to ``submit`` and keeps at most ``depth``
batches in flight: with depth 2, batch N+1 is claimed, preprocessed and copied
to the device while batch N computes. ``limit`` is asked once per batch, before
the claim, so the memory guard can shrink a bin's batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from carpool.catalogue import BinSpec
from carpool.jobs import ClaimedJob, Outcome
from worker.handlers.base import ModelHandler
from worker.runner import run_batch


class BatchExecutor(Protocol):
    #: Batches the loop may hold in flight at once (claimed, not yet completed).
    depth: int

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        """How many jobs the next batch of this bin may claim (≤ ``max_batch``)."""

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        """Start a batch; the future gives one Outcome per job, in order."""

    def close(self) -> None:
        """Release threads and buffers; called once the loop has stopped."""


class InlineExecutor:
    """Runs each batch on the loop's own thread as it is submitted (depth 1).

    The synthetic model needs nothing more, and it keeps a worker without torch
    models free of torch.
    """

    depth = 1

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return max_batch

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        future: Future[list[Outcome]] = Future()
        try:
            future.set_result(run_batch(handler, bin_spec, jobs))
        except Exception as exc:  # noqa: BLE001 — delivered to the loop through the future
            future.set_exception(exc)
        return future

    def close(self) -> None:
        return None
