"""The bootstep that starts and stops the batching loop inside a Celery worker.

The loop runs in its own thread, so the worker's main thread stays free for
heartbeats, pings and remote-control commands. A warm shutdown (SIGTERM) calls
``stop``: the loop finishes the batch in hand, then the thread ends.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

from carpool.errors import ConfigError
from carpool.keys import Keys
from carpool.queue import Queue, connect
from carpool.settings import Settings, load_settings
from worker.handlers import TORCH_KINDS, ModelHandler, make_handler, resolve_device
from worker.loop import MAX_BLOCK_S, BatchLoop
from worker.pipeline import BatchExecutor, InlineExecutor

log = logging.getLogger(__name__)

#: Redis socket timeout for the loop: above its longest block, so BLPOP never times out.
LOOP_SOCKET_TIMEOUT_S = MAX_BLOCK_S + 10.0


def load_handlers(settings: Settings, names: tuple[str, ...], explicit: bool,
                  ) -> dict[str, ModelHandler]:
    """Loaded handlers by model name. A model named in CARPOOL_MODELS that cannot load
    stops the worker; with CARPOOL_MODELS empty ("every model"), it is left out and
    the log says why in an ERROR line."""
    handlers: dict[str, ModelHandler] = {}
    for name in names:
        try:
            handler = make_handler(settings.catalogue.get(name), settings)
            handler.load()
        except ConfigError as exc:
            if explicit:
                raise
            log.error("not serving model %r: %s (list the models to serve in CARPOOL_MODELS "
                      "to make this fatal)", name, exc)
            continue
        handlers[name] = handler
    if not handlers:
        raise ConfigError(f"none of the models {', '.join(names)} could be loaded")
    return handlers


def make_executor(settings: Settings, handlers: dict[str, ModelHandler]) -> BatchExecutor:
    """The torch executor, warmed up and calibrated, when a torch model is served;
    otherwise the inline one (and torch is never imported)."""
    torch_handlers = [h for h in handlers.values() if h.spec.kind in TORCH_KINDS]
    if not torch_handlers:
        return InlineExecutor()
    from worker.calibrate import prepare
    from worker.executor import TorchExecutor

    executor = TorchExecutor(settings.executor, resolve_device(settings.executor.device))
    for handler in torch_handlers:
        prepare(executor, handler, settings.executor)
    return executor


class BatchLoopStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Owns one BatchLoop and its thread for the life of the worker."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.loop: BatchLoop | None = None
        self.thread: threading.Thread | None = None
        self.events: Any = None

    def start(self, parent: Any) -> None:
        from worker.flower import FlowerBatchEvents

        settings = load_settings()
        client = connect(settings.redis_url, socket_timeout_s=LOOP_SOCKET_TIMEOUT_S)
        queue = Queue(client, Keys(settings.key_prefix))
        names = settings.worker_models or tuple(spec.name for spec in settings.catalogue)
        handlers = load_handlers(settings, names, explicit=bool(settings.worker_models))
        hostname = parent.hostname
        self.events = FlowerBatchEvents(parent.app, hostname)
        self.loop = BatchLoop(settings, queue, handlers, settings.worker_name or hostname,
                              listeners=[self.events],
                              executor=make_executor(settings, handlers))
        parent.carpool_loop = self.loop  # remote-control commands find it here
        self.thread = threading.Thread(target=self._run, name="carpool-batch-loop", daemon=True)
        self.thread.start()
        log.info("carpool batch loop started for models %s", ", ".join(handlers))

    def _run(self) -> None:
        assert self.loop is not None
        try:
            self.loop.run()
        finally:
            if self.events is not None:
                self.events.close()

    def stop(self, parent: Any) -> None:
        if self.loop is None or self.thread is None:
            return
        log.info("carpool batch loop stopping after the batch in hand")
        self.loop.stop()
        self.thread.join()
        self.loop.executor.close()
        log.info("carpool batch loop stopped")
