"""What every request of one app shares: settings, the queue, the long-poll notifier, metrics."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app

from carpool.queue import Queue
from carpool.registry import RegistryCache
from carpool.settings import Settings
from web.metrics import WebMetrics
from web.reads import AdmitBatcher, ReadBatcher
from web.waiters import Notifier

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
    #: Admissions of concurrent ``POST /submit`` requests, sharing admit.lua calls.
    admits: AdmitBatcher
    #: Which models the live workers serve or refused (cached a few seconds).
    models: RegistryCache

    def close(self) -> None:
        """Stop the listener and drop the Redis connections (tests; an app is per process)."""
        self.notifier.close()
        self.queue.client.close()


def current_state() -> WebState:
    state = current_app.extensions[EXTENSION]
    assert isinstance(state, WebState)
    return state
