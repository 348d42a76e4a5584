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
                 on_beat: Callable[[WorkerModels], object] | None = None,
                 generations: Mapping[str, int] | None = None) -> None:
        self.registry = registry
        self.interval_s = interval_s
        #: Run after each beat with the entry it published (worker/shell/refusal_watch.py's
        #: tick), on this thread: so after the refusal it acts on is published.
        self.on_beat = on_beat
        #: Each bin's fitted cost, read at each beat (the batch loop's, once it runs).
        self.costs: Callable[[], Mapping[tuple[str, str], Cost]] = dict
        #: ``generations``: the repository generation of each model it may serve.
        self._entry = WorkerModels(worker, (), {}, tuple(trying),
                                   generations=dict(generations or {}))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def refuse(self, model: str, reason: str) -> None:
        """``model`` cannot load here: no longer loading, refused with ``reason``."""
        self._set(model, refused=reason)

    def loading(self, model: str) -> None:
        """``model`` loads now (the repository API asked): neither served nor refused."""
        self._set(model, loading=True)

    def settled(self, model: str, generation: int, *, served: bool,
                refused: str | None = None) -> None:
        """This worker has acted on ``generation`` of ``model``: it serves it, refused
        it with ``refused``, or neither (unloaded)."""
        self._set(model, served=served, refused=refused, generation=generation)

    def _set(self, model: str, *, served: bool = False, loading: bool = False,
             refused: str | None = None, generation: int | None = None) -> None:
        def only(models: Sequence[str], keep: bool) -> tuple[str, ...]:
            return (*(m for m in models if m != model), *((model,) if keep else ()))

        with self._lock:
            e = self._entry
            others = {m: r for m, r in e.refused.items() if m != model}
            self._entry = replace(
                e, served=only(e.served, served), loading=only(e.loading, loading),
                refused=others if refused is None else {**others, model: refused},
                generations=e.generations if generation is None else
                {**e.generations, model: generation})
        self._wake.set()

    def serve(self, served: Sequence[str]) -> None:
        """The batch loop runs ``served``: nothing it loaded at start is loading any more."""
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
                                      cold_start_s=entry.cold_start_s, costs=self.costs(),
                                      generations=entry.generations)
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
