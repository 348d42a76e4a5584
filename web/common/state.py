"""What every request of one app shares: settings, queue, long-poll notifier and caps, metrics."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app

from carpool.backend.admissions import Admissions
from carpool.backend.bulkdb import BulkDb
from carpool.backend.filestore import FileStore
from carpool.backend.queue import Queue
from carpool.backend.registry import RegistryCache
from carpool.backend.repository import Repository
from carpool.core.settings import Settings
from web.common.bodies import BodyLimits
from web.common.metrics import WebMetrics
from web.common.routing import Routing
from web.results.polls import PollCounter
from web.results.reads import ReadBatcher
from web.results.waiters import Notifier

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
    #: Files' and batches' records (Redis) and the files' bytes (web/openai/files.py).
    bulkdb: BulkDb
    files: FileStore
    #: Which models are loaded: the repository API's desired states (/v2/repository).
    repository: Repository
    #: The version each job goes to, and the shadow copies (docs/deployments.md).
    routing: Routing

    def close(self) -> None:
        """Stop the listener and drop the Redis connections (tests; an app is per process)."""
        self.notifier.close()
        self.queue.client.close()


def current_state() -> WebState:
    state = current_app.extensions[EXTENSION]
    assert isinstance(state, WebState)
    return state
