"""Webhooks under faults, with real processes: a dispatcher and a worker killed with
deliveries pending, a receiver that fails for a while, one that never answers 2xx, and
one that asks for a later retry. Every event arrives at least once; duplicates share
their webhook-id; what cannot be delivered ends dead-lettered, on the job and in
`carpool audit`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.outbox import Outbox
from carpool.backend.queue import Queue
from carpool.core.jobs import JobStatus
from carpool.core.webhooks import hook_field
from tests.conftest import make_env
from tests.support.faults import all_final, spawn_worker, stop_process
from tests.support.hookstack import (
    DEPLOY_SECRET,
    KEY_SHARED,
    body_of,
    document,
    hook_env,
    outbox_empty,
    submit,
)
from tests.support.jobs import admit, synthetic
from tests.support.procs import (
    REPO_ROOT,
    dispatcher_command,
    start_dispatcher,
    start_web,
    start_worker,
    wait_until,
)
from tests.support.receiver import Received, always, receiver
from tests.support.redisproc import RedisProc, private_redis

ARRIVAL_TIMEOUT_S = 90.0
#: A dispatcher's log says this each time Redis failed it (dispatcher/dispatcher.py).
REDIS_DOWN_LOG = "Redis unavailable"
LEASE_MS = 1500


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProc]:
    with private_redis() as s:
        yield s


def test_killed_dispatcher_and_worker_lose_no_event(server: RedisProc, key_prefix: str,
                                                    tmp_path: Path) -> None:
    """kill -9 of the dispatcher while its tries hang at the receiver, and of the worker
    while its (5 s) batch runs: once both are back, every event is delivered at least once,
    and each duplicate carries the webhook-id of its first delivery."""
    env = make_env(server.url, key_prefix, **hook_env(
        CARPOOL_LEASE_MS=str(LEASE_MS), CARPOOL_SYNTHETIC_COST_MS="5000,0"))
    release = threading.Event()

    def hang_until_released(_n: int, _r: Received) -> tuple[int, dict[str, str]]:
        release.wait(30)  # the receiver holds each try until the dispatcher is dead
        return 200, {}

    client = connect(server.url)
    queue = Queue(client, Keys(key_prefix))
    log = tmp_path / "worker.log"
    with receiver(hang_until_released) as rx, start_web(env) as base:
        ids = submit(base, KEY_SHARED, f"{rx.url}/h", n=12, events=["running", "done"])
        worker = spawn_worker(env, "w1@hooks", log)
        dispatcher = subprocess.Popen(dispatcher_command(), cwd=REPO_ROOT,
                                      env={**os.environ, **env,
                                           "CARPOOL_DISPATCH_METRICS_PORT": "0"},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            # Running events are in the receiver's hands (held), the batch computes.
            wait_until(lambda: len(rx.all()) >= 3, ARRIVAL_TIMEOUT_S, "tries in flight")
            worker.kill()
            dispatcher.kill()
            worker.wait(10)
            dispatcher.wait(10)
            release.set()
            assert not all_final(queue, ids)  # the batch died with the worker
            with start_worker(env, "w1@hooks"), start_dispatcher(env):
                want = {f"{i}.{e}" for i in ids for e in ("running", "done")}
                rx.wait_for_ids(want, ARRIVAL_TIMEOUT_S)
                wait_until(lambda: outbox_empty(Outbox(client, queue.keys)),
                           ARRIVAL_TIMEOUT_S, "the outbox to empty")
        finally:
            release.set()
            stop_process(worker)
            stop_process(dispatcher)
        got = rx.all()
        for r in got:
            doc = body_of(r)
            assert Webhook(DEPLOY_SECRET).verify(r.body, r.headers) == doc
            assert r.webhook_id == f"{doc['id']}.{doc['event']}"
        assert {r.webhook_id for r in got} == want
        assert len(got) > len(want)  # the killed tries and the re-run claim came again
        assert all(queue.get(i).status is JobStatus.DONE for i in ids)  # type: ignore
    client.close()


def test_a_receiver_failing_for_10_s_then_answering_receives_everything(
        server: RedisProc, key_prefix: str) -> None:
    t_up = time.time() + 10.0
    env = make_env(server.url, key_prefix, **hook_env())
    with receiver(lambda _n, r: (500, {}) if r.at_s < t_up else (200, {})) as rx, \
            start_web(env) as base, start_worker(env), start_dispatcher(env):
        ids = submit(base, KEY_SHARED, f"{rx.url}/h", n=20)
        want = {f"{i}.done" for i in ids}
        wait_until(lambda: all(document(base, KEY_SHARED, i)["webhook"]["state"] == "delivered"
                               for i in ids), ARRIVAL_TIMEOUT_S, "every delivery")
        got = rx.all()
        assert {r.webhook_id for r in got} == want
        last = {r.webhook_id: r.at_s for r in got}
        assert min(last.values()) >= t_up  # each one's last try is one after the outage
        hook = document(base, KEY_SHARED, ids[0])["webhook"]
        assert hook["attempts"] > 1 and hook["last_status"] == 200
        assert any(r.at_s < t_up for r in got)  # tries during the outage were made


def test_a_receiver_that_never_answers_2xx_ends_dead_lettered(server: RedisProc,
                                                              key_prefix: str) -> None:
    env = make_env(server.url, key_prefix, **hook_env(CARPOOL_WEBHOOK_MAX_AGE_S="3"))
    with receiver(always(500)) as rx, start_web(env) as base, start_worker(env), \
            start_dispatcher(env):
        ids = submit(base, KEY_SHARED, f"{rx.url}/never", n=3)
        wait_until(lambda: all(document(base, KEY_SHARED, i)["webhook"]["state"] == "dead"
                               for i in ids), ARRIVAL_TIMEOUT_S, "every delivery dead")
        hook = document(base, KEY_SHARED, ids[0])["webhook"]
        assert hook["last_status"] == 500 and hook["last_error"] == "HTTP 500"
        assert hook["attempts"] >= 2 and hook["event"] == "done"
        audit = subprocess.run([sys.executable, "-m", "carpool.cli", "audit"],
                               env={**os.environ, **env}, cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=60)
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert "3 dead webhook deliveries shown" in audit.stdout
        for job_id in ids:
            assert f"{job_id} done {rx.url}/never" in audit.stdout
        assert len({r.webhook_id for r in rx.all()}) == 3


def test_a_receivers_retry_after_is_waited_out(server: RedisProc, key_prefix: str) -> None:
    env = make_env(server.url, key_prefix, **hook_env(CARPOOL_WEBHOOK_RETRY_MAX_S="10"))
    with receiver(lambda n, _r: (503, {"Retry-After": "3"}) if n == 0 else (200, {})) as rx, \
            start_web(env) as base, start_worker(env), start_dispatcher(env):
        (job,) = submit(base, KEY_SHARED, f"{rx.url}/later")
        wait_until(lambda: len(rx.all()) == 2, ARRIVAL_TIMEOUT_S, "the second try")
        first, second = rx.all()
        assert first.webhook_id == second.webhook_id
        assert second.at_s - first.at_s >= 3.0  # the backoff alone would be under 0.2 s
        assert document(base, KEY_SHARED, job)["webhook"]["state"] == "delivered"


def test_a_2xx_with_an_unreadable_retry_after_is_delivered_once(server: RedisProc,
                                                                key_prefix: str) -> None:
    """A receiver's 200 with ``Retry-After: ²`` (byte 0xB2, which str.isdigit takes for a
    digit) took the event: it is delivered, not tried again until it is dead."""
    env = make_env(server.url, key_prefix, **hook_env())
    with receiver(lambda _n, _r: (200, {"Retry-After": "\u00b2"})) as rx, \
            start_web(env) as base, start_worker(env), start_dispatcher(env):
        (job,) = submit(base, KEY_SHARED, f"{rx.url}/odd", events=["done"])
        wait_until(lambda: document(base, KEY_SHARED, job)["webhook"]["state"] != "pending",
                   ARRIVAL_TIMEOUT_S, "the first try's outcome")
        hook = document(base, KEY_SHARED, job)["webhook"]
        assert hook == {"state": "delivered", "attempts": 1, "last_status": 200,
                        "last_error": None, "event": "done"}
        assert len(rx.all()) == 1


def test_a_dispatcher_delivers_again_once_redis_is_back(key_prefix: str,
                                                        tmp_path: Path) -> None:
    """Redis killed under a running dispatcher process, down through its retries (a take
    that fails must give its delivery slots back), then restarted: events recorded
    after it came back are delivered."""
    log = tmp_path / "dispatcher.log"
    with private_redis() as srv, receiver() as rx, log.open("wb") as out:
        env = make_env(srv.url, key_prefix, **hook_env(CARPOOL_DISPATCH_METRICS_PORT="0"))
        proc = subprocess.Popen(dispatcher_command(), cwd=REPO_ROOT, env={**os.environ, **env},
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: "dispatching webhooks" in log.read_text(), 30.0,
                       "the dispatcher to start")
            srv.kill()
            # Two failures: the second one at least is a take (after its 1 s pause). A
            # dispatcher whose failed take kept its slots never calls Redis again.
            wait_until(lambda: log.read_text().count(REDIS_DOWN_LOG) >= 2, 20.0,
                       "the dispatcher to keep retrying Redis")
            srv.restart()
            client = connect(srv.url)
            queue = Queue(client, Keys(key_prefix))
            spec = synthetic()
            ids = [admit(queue, spec, hook=hook_field(f"{rx.url}/h", ("cancelled",)))
                   for _ in range(3)]
            for job_id in ids:
                assert queue.cancel(job_id, 60) == "cancelled"
            rx.wait_for_ids({f"{i}.cancelled" for i in ids}, 30.0)
            client.close()
        finally:
            stop_process(proc)
