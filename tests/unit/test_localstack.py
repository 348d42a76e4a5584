"""`carpool up`'s ports: a taken default is replaced by a free one (and said so); a
taken port that the user asked for is refused with the reason."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from carpool.core.errors import ConfigError
from carpool.core.settings import load_settings
from carpool.stack.localstack import (
    DEFAULT_MAX_WAIT_S,
    DEFAULT_STOP_GRACE_S,
    pick_port,
    port_problem,
    stop_grace_s,
)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_taken_default_port_is_replaced_by_a_free_one_with_a_note(taken_port: int) -> None:
    notes: list[str] = []
    port = pick_port(None, taken_port, "web (--port)", notes)
    assert port != taken_port and port_problem(port) is None
    assert notes == [f"web (--port): port {taken_port} is taken, using {port}"]


def test_a_taken_port_asked_for_is_refused_with_the_reason(taken_port: int) -> None:
    with pytest.raises(ConfigError, match=f"port {taken_port} is already in use"):
        pick_port(taken_port, 8000, "web (--port)", [])


def test_a_port_whose_last_connection_lingers_in_time_wait_is_free_to_listen_on() -> None:
    """A stack just stopped leaves its served connections in TIME_WAIT for a minute;
    gunicorn binds with SO_REUSEADDR, so the restart must not be refused."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end lingers in TIME_WAIT
        client.recv(1)
        client.close()
    assert port_problem(port) is None


def test_the_stop_waits_out_the_workers_batch_and_the_webs_longest_poll() -> None:
    settings = load_settings({})  # the defaults it reads are the settings' own
    assert (DEFAULT_STOP_GRACE_S, DEFAULT_MAX_WAIT_S) == (settings.stop_grace_s,
                                                          settings.max_wait_s)
    assert stop_grace_s({}) >= max(45, 60 + 10)  # the defaults
    assert stop_grace_s({"CARPOOL_STOP_GRACE_S": "300", "CARPOOL_MAX_WAIT_S": "5"}) >= 300
    assert stop_grace_s({"CARPOOL_MAX_WAIT_S": "-1"}) >= 70  # unreadable: the defaults
