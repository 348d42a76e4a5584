"""What the batch loop tells the rest of the worker: its observers, one named method
per event.

Like dramatiq's middleware, each observer implements the events it needs on a
subclass of ``Observer`` (whose methods do nothing): Flower events and metrics
observe the loop here. Observers are monitoring only: the loop tells them in order,
on its own thread, and logs (never raises) what one raises, so an observer may fail
without effect on any job. What jobs depend on is no observer: the loop feeds its
scheduler directly and calls its lease keeper by name (worker/loop/leasekeeper.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from carpool.core.jobs import Claim, Outcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchReport:
    """What one batch did, for Flower events, metrics and logs."""

    model: str
    bin: str
    size: int
    failed: int
    refused: int  # results the queue refused: the lease was lost meanwhile
    runtime_s: float  # claim to completion, as the worker saw it
    inference_ms: float  # the forward pass alone (max over the batch's outcomes)
    queue_ms: list[int]  # per job: admission to claim, on Redis's clock
    #: Per job, in claim order: its outcome, and whether its result was written
    #: (False: refused, the lease was lost). Metrics count written jobs only.
    outcomes: tuple[Outcome, ...] = ()
    written: tuple[bool, ...] = ()
    #: Claim (or, when a batch ahead was still in flight, that batch's completion) to
    #: completion: what this batch itself cost the worker, the cost model's t(n). At
    #: depth 1 it equals ``runtime_s``; in a pipeline, ``runtime_s`` also counts the
    #: wait behind the batch ahead, which depends on that batch, not on n.
    service_s: float = 0.0


class BatchObserver(Protocol):
    """The events of a claim's life, each with its own method."""

    def on_claimed(self, claim: Claim) -> None:
        """The claim's jobs are in hand and about to run (``claim.jobs`` is not empty)."""

    def on_expired(self, claim: Claim) -> None:
        """The claim ended ``claim.expired`` jobs instead (past or too near their
        deadline, or queued too long; it may hold no job at all)."""

    def on_finished(self, claim: Claim, report: BatchReport) -> None:
        """The batch's results are written (some may have been refused)."""

    def on_failed(self, claim: Claim) -> None:
        """The batch ended without its results written (Redis lost mid-write, a bug):
        the loop has handed its jobs back (or, with Redis away, left its lease to
        lapse)."""

    def on_idle(self) -> None:
        """The loop is about to block on Redis until a job arrives: no batch in flight
        and no job it would claim (a paused bin's jobs do not count; a bin filling
        its batch window does, and is not idle: its batch leaves within
        milliseconds). Called again at each such block, at least once a second
        while the worker idles, so it must be cheap when it has nothing to do."""


class Observer:
    """A ``BatchObserver`` that does nothing: subclass it and override what you need."""

    def on_claimed(self, claim: Claim) -> None:
        return None

    def on_expired(self, claim: Claim) -> None:
        return None

    def on_finished(self, claim: Claim, report: BatchReport) -> None:
        return None

    def on_failed(self, claim: Claim) -> None:
        return None

    def on_idle(self) -> None:
        return None


def tell_observers(observers: Sequence[BatchObserver],
                   call: Callable[[BatchObserver], None]) -> None:
    """``call`` each of ``observers`` (``lambda o: o.on_claimed(claim)``); log what one
    raises and go on with the next."""
    for observer in observers:
        try:
            call(observer)
        except Exception:  # noqa: BLE001 — monitoring must never fail a batch
            log.exception("batch observer %r failed", observer)
