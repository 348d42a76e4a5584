"""A ``BatchObserver`` that records every call, for tests of the batch loop."""

from __future__ import annotations

import threading

from carpool.core.jobs import Claim
from worker.loop.observers import BatchReport


class Recorder:
    """Each event as ``(event, claim, report)``; event is "claimed", "expired",
    "finished" or "failed"; report is None but for "finished".
    ``on_idle``, which has no claim, is counted apart (``idles``)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Claim, BatchReport | None]] = []
        self.idles = 0
        self._lock = threading.Lock()

    def _add(self, event: str, claim: Claim, report: BatchReport | None = None) -> None:
        with self._lock:
            self.calls.append((event, claim, report))

    def on_claimed(self, claim: Claim) -> None:
        self._add("claimed", claim)

    def on_expired(self, claim: Claim) -> None:
        self._add("expired", claim)

    def on_finished(self, claim: Claim, report: BatchReport) -> None:
        self._add("finished", claim, report)

    def on_failed(self, claim: Claim) -> None:
        self._add("failed", claim)

    def on_idle(self) -> None:
        with self._lock:
            self.idles += 1

    def events(self) -> list[str]:
        with self._lock:
            return [h for h, _, _ in self.calls]

    def tokens(self, event: str) -> list[str]:
        with self._lock:
            return [c.token for h, c, _ in self.calls if h == event]

    def reports(self) -> list[BatchReport]:
        with self._lock:
            return [r for _, _, r in self.calls if r is not None]
