"""Rates from exponentially decayed counts: arrivals (for the scheduler) and drains
(for Retry-After) share one estimator.

A count ``c`` that decays by ``exp(-dt/τ)`` and grows by each event's weight is,
divided by ``τ``, the event rate averaged over about the last ``τ``. Early on the
count has not built up yet; dividing by ``τ·(1 − exp(−age/τ))`` instead removes
that bias. The age is floored at ``min_age_ms`` so that one event just after the
start does not read as a huge rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def decayed_rate_per_ms(count: float, age_ms: float, tau_ms: float, min_age_ms: float) -> float:
    """Events per ms from a decayed ``count`` whose first event was ``age_ms`` ago."""
    if count <= 0 or age_ms < 0:
        return 0.0
    return count / (tau_ms * -math.expm1(-max(age_ms, min_age_ms) / tau_ms))


@dataclass
class RateMeter:
    """The rate of a monotonic counter read at irregular times (e.g. a bin's admissions)."""

    tau_ms: float
    min_age_ms: float
    _count: float = 0.0
    _last_total: int | None = None
    _last_ms: int = 0
    _first_ms: int | None = None

    def update(self, now_ms: int, total: int) -> None:
        """Read the counter's ``total`` at ``now_ms``; the first read only sets a baseline."""
        if self._last_total is None or total < self._last_total:  # first read, or a reset
            self._last_total, self._last_ms = total, now_ms
            return
        added = total - self._last_total
        dt = max(0, now_ms - self._last_ms)
        self._count = self._count * math.exp(-dt / self.tau_ms) + added
        if added and self._first_ms is None:
            self._first_ms = self._last_ms  # the events happened since the previous read
        self._last_total, self._last_ms = total, now_ms

    def per_ms(self, now_ms: int) -> float:
        if self._first_ms is None:
            return 0.0
        count = self._count * math.exp(-max(0, now_ms - self._last_ms) / self.tau_ms)
        return decayed_rate_per_ms(count, now_ms - self._first_ms, self.tau_ms, self.min_age_ms)
