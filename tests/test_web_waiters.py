"""The long-poll notifier on real Redis: wakes by id, survives a lost connection and a fork."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest
import redis

from carpool.connection import connect
from carpool.keys import Keys
from tests.procs import wait_until
from web.waiters import Notifier

#: Bound on any one wait here; each normally takes milliseconds.
BOUND_S = 10.0


@pytest.fixture
def listener_name(key_prefix: str) -> str:
    return f"notifier-{key_prefix}"


@pytest.fixture
def notifier(redis_url: str, keys: Keys, listener_name: str) -> Iterator[Notifier]:
    # Named, so the test can find (and kill) exactly this listener's connection.
    own = redis.Redis.from_url(redis_url, decode_responses=True, client_name=listener_name,
                               socket_timeout=5.0)
    n = Notifier(own, keys.done_channel, keys.results_channel)
    yield n
    n.close()
    own.close()


def listener_ids(client: redis.Redis, name: str) -> list[int]:
    """Redis client ids of our listener's subscribed connections."""
    return [int(c["id"]) for c in client.client_list()
            if c.get("name") == name and int(c.get("sub", 0)) > 0]


def test_notifier_wakes_only_the_polls_of_the_published_id(
    notifier: Notifier, client: redis.Redis, keys: Keys, listener_name: str
) -> None:
    with notifier.watch("job-a") as a, notifier.watch("job-b") as b:
        wait_until(lambda: bool(listener_ids(client, listener_name)), BOUND_S, "a subscription")
        a.clear()
        b.clear()  # the first subscribe wakes every poll once, to re-read
        client.publish(keys.done_channel, "job-a")
        assert a.wait(BOUND_S)
        assert not b.is_set()
        assert notifier.watching("job-a") == 1
    assert notifier.watching("job-a") == 0


def test_notifier_wakes_every_poll_and_resubscribes_when_its_connection_is_killed(
    notifier: Notifier, client: redis.Redis, keys: Keys, listener_name: str
) -> None:
    with notifier.watch("job-a") as a:
        wait_until(lambda: bool(listener_ids(client, listener_name)), BOUND_S, "a subscription")
        [first] = listener_ids(client, listener_name)
        a.clear()
        client.client_kill_filter(_id=str(first))
        assert a.wait(BOUND_S), "a lost subscription must wake its polls to re-read"
        wait_until(lambda: listener_ids(client, listener_name) not in ([], [first]), BOUND_S,
                   "a new subscription")
        a.clear()
        client.publish(keys.done_channel, "job-a")
        assert a.wait(BOUND_S)


def test_close_stops_the_listener_thread(
    notifier: Notifier, client: redis.Redis, listener_name: str
) -> None:
    with notifier.watch("job-a"):
        wait_until(lambda: bool(listener_ids(client, listener_name)), BOUND_S, "a subscription")
    notifier.close()
    assert not any(t.name == "carpool-notifier" and t.is_alive() for t in threading.enumerate())
    wait_until(lambda: not listener_ids(client, listener_name), BOUND_S, "the unsubscription")


def test_a_forked_child_starts_its_own_listener(
    notifier: Notifier, redis_url: str, client: redis.Redis, keys: Keys, listener_name: str
) -> None:
    with notifier.watch("in-parent"):  # the parent's listener runs when the child forks
        wait_until(lambda: len(listener_ids(client, listener_name)) == 1, BOUND_S,
                   "the parent's subscription")
        pid = os.fork()
        if pid == 0:  # the child: no pytest here, only os._exit
            code = 1
            try:
                with notifier.watch("in-child") as woken:
                    own = connect(redis_url)
                    wait_until(lambda: len(listener_ids(own, listener_name)) == 2, BOUND_S,
                               "the child's subscription")
                    woken.clear()
                    own.publish(keys.done_channel, "in-child")
                    code = 0 if woken.wait(BOUND_S) else 2
            finally:
                os._exit(code)
        exit_status: list[int] = []

        def child_exited() -> bool:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                exit_status.append(status)
            return bool(done)

        try:
            wait_until(child_exited, BOUND_S * 2, "the child to exit")
        finally:
            if not exit_status:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(exit_status[0]) == 0
