"""The Celery app that GPU workers run: `celery -A worker.celery_app worker --pool solo`.

Celery requires a module-level app for ``-A``; creating it is cheap and reads only
the broker URL. Settings, Redis scripts and models load when the worker starts
(in the bootstep), never on import.
"""

from __future__ import annotations

import faulthandler
import os
import sys

from celery import Celery
from kombu.entity import Queue

from carpool.core.errors import ConfigError
from carpool.core.settings import DEFAULT_REDIS_URL
from worker.shell import control  # noqa: F401 — registers carpool_scheduler and carpool_tune
from worker.shell.bootstep import BatchLoopStep

#: The one Celery queue carpool's workers consume. Never Celery's default `celery`:
#: another application's tasks sent to the same Redis database would be received
#: by carpool's workers and discarded as unregistered. Jobs do not travel here (they
#: live in carpool's bins); the queue is only what a Celery worker must consume.
CELERY_QUEUE = "carpool"


def create_celery_app() -> Celery:
    if sys.__stderr__ is not None:
        # A model's native code that crashes the worker (a segfault, an abort) printed
        # nothing anywhere: its jobs failed "worker lost N times" and nobody could tell
        # which code did it. Each thread's Python stack, the handler's forward among
        # them, now goes to stderr (Celery's --logfile captures only its loggers).
        faulthandler.enable(file=sys.__stderr__)
    broker = os.environ.get("CELERY_BROKER_URL") or os.environ.get(
        "CARPOOL_REDIS_URL", DEFAULT_REDIS_URL)
    if os.environ.get("CARPOOL_REDIS_CLUSTER") == "1" and not os.environ.get("CELERY_BROKER_URL"):
        # kombu's Redis transport speaks to one Redis, not to a cluster's shards.
        raise ConfigError("CARPOOL_REDIS_CLUSTER=1 needs CELERY_BROKER_URL: Celery's Redis "
                          "transport does not support Redis Cluster; name a standalone Redis "
                          "for Celery's own messages (jobs never travel through it)")
    app = Celery("carpool", broker=broker)
    app.conf.update(
        # JSON only: a pickled message pushed into the broker is refused, never run.
        accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        # No result backend: batch outcomes live in carpool's own job records.
        task_ignore_result=True,
        # One process per GPU runs the batching loop; it prefetches no Celery tasks.
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        broker_connection_retry_on_startup=True,
        # A Redis at maxmemory (noeviction) refuses kombu's own writes (the lock of its
        # message-restore sweep, queue bindings) with an error reply, not a lost
        # connection. Retried like a lost connection, it restarts only the Celery
        # consumer, while the batch loop keeps draining the bins (its completions
        # free memory, so Redis takes them); otherwise the worker would exit.
        broker_channel_error_retry=True,
        worker_hijack_root_logger=False,
        task_default_queue=CELERY_QUEUE,
        task_queues=[Queue(CELERY_QUEUE)],  # type: ignore[no-untyped-call]
        # A queue not listed above is an error, never a silent subscription.
        task_create_missing_queues=False,
    )
    app.steps["worker"].add(BatchLoopStep)
    return app


app = create_celery_app()
