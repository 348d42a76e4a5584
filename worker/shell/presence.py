"""The worker's entry in the model registry (carpool/backend/registry.py), kept by a heartbeat.

A worker says which models it serves, which it refused, with the reason, and which
it is still loading, so the web can refuse at once a job for a model nobody will
run, instead of queueing it until its TTL. The entry appears before the first model
loads (every model it will try, "loading"); each refusal is published as soon as it
is known, and the served models once the batch loop can run them. The entry is
renewed every ``HEARTBEAT_S`` and lapses when the worker dies; a clean stop
withdraws it at once. Each beat also carries the bins' fitted costs (``costs``, read
at each beat) and each model's cold start once its first batch ran: the scaling rule's
inputs (carpool/backend/need_gauges.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from carpool.backend.registry import HEARTBEAT_S, Registry, WorkerModels
from carpool.core.errors import BackendUnavailable
from carpool.scheduling.batching import Cost

log = logging.getLogger(__name__)


class Presence:
    """Publishes one worker's entry from its own thread: at once on each change, and
    every ``interval_s``."""

    def __init__(self, registry: Registry, worker: str, trying: Sequence[str],
                 interval_s: float = HEARTBEAT_S,
                 on_beat: Callable[[WorkerModels], object] | None = None) -> None:
        self.registry = registry
        self.interval_s = interval_s
        #: Run after each beat with the entry it published (worker/shell/refusal_watch.py's
        #: tick), on this thread: so after the refusal it acts on is published.
        self.on_beat = on_beat
        #: Each bin's fitted cost, read at each beat (the batch loop's, once it runs).
        self.costs: Callable[[], Mapping[tuple[str, str], Cost]] = dict
        self._entry = WorkerModels(worker, (), {}, tuple(trying))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def refuse(self, model: str, reason: str) -> None:
        """``model`` cannot load here: no longer loading, refused with ``reason``."""
        with self._lock:
            e = self._entry
            self._entry = replace(e, refused={**e.refused, model: reason},
                                  loading=tuple(m for m in e.loading if m != model))
        self._wake.set()

    def serve(self, served: Sequence[str]) -> None:
        """The batch loop runs ``served``: nothing is loading any more."""
        with self._lock:
            e = self._entry
            self._entry = replace(e, served=tuple(served), loading=())
        self._wake.set()

    def cold_start(self, model: str, seconds: float) -> None:
        """``model``'s first batch ran ``seconds`` after this process started."""
        with self._lock:
            e = self._entry
            self._entry = replace(e, cold_start_s={**e.cold_start_s, model: seconds})
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="carpool-presence", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()  # before reading the entry: a change after it wakes again
            entry = self._entry
            try:
                self.registry.publish(entry.worker, entry.served, entry.refused, entry.loading,
                                      cold_start_s=entry.cold_start_s, costs=self.costs())
            except BackendUnavailable as exc:  # the entry lapses; the next beat renews it
                log.warning("model registry heartbeat failed (%s)", exc)
            if self.on_beat is not None:
                try:
                    self.on_beat(entry)
                except Exception:  # noqa: BLE001 — the heartbeat must go on; the next beat retries
                    log.exception("after the model registry heartbeat")
            self._wake.wait(self.interval_s)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.registry.withdraw(self._entry.worker)
        except BackendUnavailable:
            pass  # it lapses on its own
