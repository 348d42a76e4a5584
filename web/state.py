"""What every request of one app shares: settings, queue, long-poll notifier and caps, metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flask import current_app

from carpool.backend.admitting import Admissions
from carpool.backend.batchdb import BatchDb
from carpool.backend.filestore import FileStore
from carpool.backend.queue import Queue
from carpool.backend.registry import RegistryCache
from carpool.core.settings import Settings
from web.metrics import WebMetrics
from web.polls import PollCounter
from web.reads import ReadBatcher
from web.waiters import Notifier

if TYPE_CHECKING:  # web.bodies reads the state of each request: imported there at run time
    from web.bodies import BodyLimits

#: The key of the app's WebState in ``app.extensions``.
EXTENSION = "carpool"


@dataclass(frozen=True)
class WebState:
    settings: Settings
    queue: Queue
    notifier: Notifier
    metrics: WebMetrics
    #: Job reads of concurrent requests, sharing round trips (``GET /result``).
    reads: ReadBatcher
    #: Admission; concurrent one-job ``POST /submit`` requests share admit.lua calls.
    admissions: Admissions
    #: Which models the live workers serve or refused (cached a few seconds).
    models: RegistryCache
    polls: PollCounter
    body_limits: BodyLimits
    #: Files' and batches' records (Redis) and the files' bytes (web/v1_files.py).
    batchdb: BatchDb
    files: FileStore

    def close(self) -> None:
        """Stop the listener and drop the Redis connections (tests; an app is per process)."""
        self.notifier.close()
        self.queue.client.close()


def current_state() -> WebState:
    state = current_app.extensions[EXTENSION]
    assert isinstance(state, WebState)
    return state
