"""What the batching loop asks of an executor, and the counters every executor keeps.

The loop claims a batch, hands it to ``submit`` and keeps at most ``depth``
batches in flight: with depth 2, batch N+1 is claimed, preprocessed and copied
to the device while batch N computes. ``limit`` is the one place a batch's size
is computed: the bin's limit after the memory guard's cap, asked before each
claim and shown by metrics and Flower.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from carpool.core.catalogue import BinSpec
from carpool.core.jobs import ClaimedJob, Outcome
from worker.device.memory import MemoryGuard
from worker.handlers.base import ModelHandler

#: Weight of the newest batch in the padding-waste average (about the last 10 batches).
PADDING_EWMA_WEIGHT = 0.1


class BatchExecutor(Protocol):
    #: Batches the loop may hold in flight at once (claimed, not yet completed).
    depth: int
    #: Caps each bin's batch below its limit when memory runs short.
    guard: MemoryGuard
    stats: ExecutorStats

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        """How many jobs the next batch of this bin may claim (≤ ``max_batch``); for
        claims only: it may move the memory guard's caps."""

    def view_limit(self, model: str, bin_name: str, max_batch: int) -> int:
        """What ``limit`` would answer now, read-only (metrics and Flower)."""

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        """Start a batch; the future gives one Outcome per job, in order."""

    def release(self) -> None:
        """Free the device memory no tensor holds any more (the CUDA cache): after out
        of memory, and once a model is unloaded."""

    def close(self) -> None:
        """Release threads and buffers; called once the loop has stopped."""


@dataclass
class ExecutorStats:
    """Counters of the compute side, read at scrape time (``worker.observe.metrics``)."""

    batches: int = 0
    #: Sub-batches re-run after a failure: out of memory, or some input broke the model.
    oom_splits: int = 0
    error_splits: int = 0
    #: Per (model, bin): the share of a collated batch that is padding, as a moving
    #: average over batches; only bins whose handler tells item sizes (``SizedItems``).
    padding_waste: dict[tuple[str, str], float] = field(default_factory=dict)

    def record_padding(self, key: tuple[str, str], waste: float) -> None:
        old = self.padding_waste.get(key)
        self.padding_waste[key] = waste if old is None else (
            old + PADDING_EWMA_WEIGHT * (waste - old))


def padding_share(sizes: Sequence[int], max_size: int) -> float | None:
    """``1 − Σ sizes / (n · max_size)``: inputs are padded to their bin's ``max_size``,
    not to the batch's longest. None without sizes."""
    if not sizes or max_size <= 0:
        return None
    clipped = [min(max_size, max(0, s)) for s in sizes]
    return 1.0 - sum(clipped) / (len(clipped) * max_size)
