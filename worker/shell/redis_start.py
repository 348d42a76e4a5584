"""The worker's first contact with Redis: connect, wait until it answers, check it.

A worker started before its Redis (compose and Kubernetes start them together, Redis
restarts) waits for it here, saying so in its log, as the GPU claim does; it used to
read the repository's state at once and exit with a traceback, which under
``carpool up`` was a crash loop that stopped the whole stack.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from celery.exceptions import WorkerShutdown

from carpool.backend.connection import connect
from carpool.backend.durability import check_durability, wait_for_redis
from carpool.core.settings import Settings


def reach_redis(settings: Settings, socket_timeout_s: float,
                should_stop: Callable[[], bool]) -> redis.Redis:
    """The worker's client, once Redis answers and its durability was checked; raises
    ``WorkerShutdown(0)`` when the worker is stopped while it waits."""
    client = connect(settings.redis_url, socket_timeout_s=socket_timeout_s,
                     cluster=settings.redis_cluster)
    if not wait_for_redis(client, "worker", should_stop):
        raise WorkerShutdown(0)  # stopped while Redis was away: nothing was started
    check_durability(client, require=settings.require_durable, who="worker")
    return client
