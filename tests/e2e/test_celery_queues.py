"""carpool's workers leave other Celery applications' tasks alone: a real worker on a
Redis database where another app queues its tasks consumes only carpool's queue."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from tests.conftest import make_env
from tests.support.procs import log_says, start_worker, wait_until
from tests.support.redisproc import RedisProc, private_redis
from worker.celery_app import CELERY_QUEUE

#: Celery's default queue: what another application's `send_task` lands in.
FOREIGN_QUEUE = "celery"
NODE = "w1@carpool-queues"


@pytest.fixture
def redis_server() -> Iterator[RedisProc]:
    # Its own Redis: a foreign task on the shared one would reach other tests' workers.
    with private_redis() as server:
        yield server


def test_worker_consumes_only_carpools_queue_not_celerys_default(
        redis_server: RedisProc, tmp_path: Path) -> None:
    other = Celery("someone-else", broker=redis_server.url)
    other.send_task("someone_else.important", args=[42])
    client = redis_server.client()
    assert client.llen(FOREIGN_QUEUE) == 1
    log = tmp_path / "worker.log"
    env = make_env(redis_server.url, f"test-{uuid.uuid4().hex[:12]}",
                   CARPOOL_MODELS="synthetic")
    with start_worker(env, node_name=NODE, log_path=log):
        control = Celery("probe", broker=redis_server.url)
        replies: dict[str, list[dict[str, str]]] = {}

        def answered() -> bool:
            replies.update(control.control.inspect(destination=[NODE], timeout=2.0
                                                   ).active_queues() or {})
            return NODE in replies

        wait_until(answered, 60.0, "the worker to answer inspect active_queues")
        queues = {q["name"] for q in replies[NODE]}
        assert queues == {CELERY_QUEUE}
        # The consumer has been running since before it answered: the foreign task
        # would be gone by now had the worker subscribed to Celery's default queue.
        assert client.llen(FOREIGN_QUEUE) == 1
        assert not log_says(log, "unregistered task")
        control.close()
    other.close()
    client.close()
