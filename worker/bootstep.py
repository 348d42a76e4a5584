"""The bootstep that starts and stops the batching loop inside a Celery worker.

The loop runs in its own thread, so the worker's main thread stays free for
heartbeats, pings and remote-control commands. A warm shutdown (SIGTERM) calls
``stop``: the loop finishes the batch in hand, then the thread ends; a batch still
running after ``CARPOOL_STOP_GRACE_S`` has its jobs handed back to the front of
their bin (its late results are then refused), so a stop never strands a job.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

from carpool.durability import check_durability
from carpool.keys import Keys
from carpool.leases import Leases
from carpool.queue import Queue, connect
from carpool.settings import Settings, load_settings
from worker.handlers import make_handler
from worker.isolation import SuspectIsolation
from worker.leasekeeper import LeaseKeeper
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
        self.keeper: LeaseKeeper | None = None
        self.settings: Settings | None = None

    def start(self, parent: Any) -> None:
        from worker.flower import FlowerBatchEvents

        settings = self.settings = load_settings()
        client = connect(settings.redis_url, socket_timeout_s=LOOP_SOCKET_TIMEOUT_S)
        check_durability(client, require=settings.require_durable, who="worker")
        keys = Keys(settings.key_prefix)
        queue = Queue(client, keys)
        leases = Leases(client, keys, settings.catalogue)
        names = settings.worker_models or tuple(spec.name for spec in settings.catalogue)
        handlers = {n: make_handler(settings.catalogue.get(n), settings) for n in names}
        for handler in handlers.values():
            handler.load()
        hostname = parent.hostname
        self.events = FlowerBatchEvents(parent.app, hostname)
        self.keeper = LeaseKeeper(leases, settings)
        self.loop = BatchLoop(settings, queue, handlers, settings.worker_name or hostname,
                              listeners=[self.keeper, self.events],
                              claim_filters=[SuspectIsolation(leases)])
        self.keeper.start()
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
        assert self.keeper is not None and self.settings is not None
        grace_s = self.settings.stop_grace_s
        log.info("carpool batch loop stopping after the batch in hand (grace %.0f s)", grace_s)
        self.loop.stop()
        self.thread.join(grace_s)
        self.keeper.stop()
        overran = self.thread.is_alive()
        # Overran: the batch was running, so its attempt stays counted. Otherwise only
        # claims that never reached the model can be left: their attempt is refunded.
        back = self.keeper.hand_back(refund_attempt=not overran)
        if overran:
            log.warning("the batch in hand outlasted the %.0f s grace: %d jobs handed back",
                        grace_s, back)
        log.info("carpool batch loop stopped; %d jobs handed back", back)
