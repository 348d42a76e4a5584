"""Batch formation: leave now, or wait until when? A pure function of clock and bins.

A bin's batch leaves when it is full, or when the bin's *oldest* job has waited
``max_wait_ms`` since admission (Redis time), whichever comes first. Across bins,
a full bin goes first; among bins that are due, the one whose oldest job's
deadline came earliest. This module imports neither torch, Celery nor Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from carpool.jobs import BinState


@dataclass(frozen=True)
class Limits:
    """A bin's batching limits, as the worker holds them now (they can be retuned)."""

    max_batch: int
    max_wait_ms: int

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")


@dataclass(frozen=True)
class Go:
    """Claim up to ``max_n`` jobs of this bin now."""

    model: str
    bin: str
    max_n: int


@dataclass(frozen=True)
class Wait:
    """Nothing is due; wake at ``until_ms`` (Redis time) or on arrival. None: only on arrival."""

    until_ms: int | None


def deadline_ms(state: BinState, limits: Limits) -> int | None:
    """When this bin's batch must leave, whether or not it is full."""
    if state.oldest_admit_ms is None or state.depth == 0:
        return None
    return state.oldest_admit_ms + limits.max_wait_ms


def decide(now_ms: int, bins: Sequence[tuple[BinState, Limits]]) -> Go | Wait:
    """Pick the bin to serve now, or say until when nothing is due."""
    full = [(s, lim) for s, lim in bins if s.depth >= lim.max_batch]
    if full:
        # Several full bins: the one whose oldest job has waited longest goes first.
        state, limits = min(full, key=lambda b: b[0].oldest_admit_ms or now_ms)
        return Go(state.model, state.bin, limits.max_batch)
    earliest: tuple[int, BinState, Limits] | None = None
    for state, limits in bins:
        due = deadline_ms(state, limits)
        if due is not None and (earliest is None or due < earliest[0]):
            earliest = (due, state, limits)
    if earliest is None:
        return Wait(None)
    due, state, limits = earliest
    if now_ms >= due:
        return Go(state.model, state.bin, limits.max_batch)
    return Wait(due)
