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

from carpool.keys import Keys
from carpool.queue import Queue, connect
from carpool.settings import load_settings
from worker.handlers import make_handler
from worker.loop import MAX_BLOCK_S, BatchLoop

log = logging.getLogger(__name__)

#: Redis socket timeout for the loop: above its longest block, so BLPOP never times out.
LOOP_SOCKET_TIMEOUT_S = MAX_BLOCK_S + 10.0


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
        handlers = {n: make_handler(settings.catalogue.get(n), settings) for n in names}
        for handler in handlers.values():
            handler.load()
        hostname = parent.hostname
        self.events = FlowerBatchEvents(parent.app, hostname)
        self.loop = BatchLoop(settings, queue, handlers, settings.worker_name or hostname,
                              listeners=[self.events])
        parent.carpool_loop = self.loop  # remote-control commands find it here
        self.thread = threading.Thread(target=self._run, name="carpool-batch-loop", daemon=True)
        self.thread.start()
        log.info("carpool batch loop started for models %s", ", ".join(names))

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
        log.info("carpool batch loop stopped")
