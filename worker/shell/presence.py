"""The worker's entry in the model registry (carpool/backend/registry.py), kept by a heartbeat.

A worker says which models it serves and which it refused, with the reason, so the
web can refuse at once a job for a model nobody will run, instead of queueing it
until its TTL. The entry is renewed every ``HEARTBEAT_S`` and lapses when the
worker dies; a clean stop withdraws it at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from carpool.backend.registry import HEARTBEAT_S, Registry
from carpool.core.errors import BackendUnavailable

log = logging.getLogger(__name__)


class Presence:
    """Publishes one worker's served and refused models from its own thread."""

    def __init__(self, registry: Registry, worker: str, served: Sequence[str],
                 refused: Mapping[str, str], interval_s: float = HEARTBEAT_S,
                 on_beat: Callable[[], object] | None = None) -> None:
        self.registry = registry
        self.worker = worker
        self.served = tuple(served)
        self.refused = dict(refused)
        self.interval_s = interval_s
        #: Run after each beat (worker/shell/refusal_watch.py's tick), on this thread.
        self.on_beat = on_beat
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="carpool-presence", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.registry.publish(self.worker, self.served, self.refused)
            except BackendUnavailable as exc:  # the entry lapses; the next beat renews it
                log.warning("model registry heartbeat failed (%s)", exc)
            if self.on_beat is not None:
                try:
                    self.on_beat()
                except Exception:  # noqa: BLE001 — the heartbeat must go on; the next beat retries
                    log.exception("after the model registry heartbeat")
            if self._stopping.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.registry.withdraw(self.worker)
        except BackendUnavailable:
            pass  # it lapses on its own
