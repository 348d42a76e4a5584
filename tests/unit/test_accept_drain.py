"""Shedding at accept, under pressure (web/common/accept_shedding.py): the wait ahead of
a connection, the accept queue drained as each request starts, a listener that defers
accept, and the lag's half of the bound."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from gevent.server import StreamServer

from carpool.stack.waiting import wait_until
from tests.unit.test_accept_shedding import GET, Judged, accepted, arrived, submit
from web.common.accept_shedding import (
    PEEK_BYTES,
    START_WEIGHT,
    AcceptShedding,
    accept_shedding_server,
    defer_accept,
)
from web.common.backlog import listen_queue
from web.common.shedding import REASON_LAG, REASON_WAIT_AHEAD


class Ticks:
    """A clock a test moves."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_ahead_is_the_oldest_unstarted_connection_or_their_count_at_the_pace() -> None:
    ticks = Ticks()
    shedding = AcceptShedding(Judged().shedder, clock=ticks)
    a, b, c, d = object(), object(), object(), object()
    assert shedding.wait_ahead_s() == pytest.approx(0.0, abs=1e-9)
    shedding.spawned(a)
    ticks.now += 0.05
    shedding.spawned(b)
    ticks.now += 0.05
    assert shedding.wait_ahead_s() == pytest.approx(0.1)  # a, handed over 100 ms ago
    shedding.began(a)
    ticks.now += 0.1
    shedding.began(b)  # b waited while a started, and started 100 ms after it: the pace
    shedding.spawned(c)
    shedding.spawned(d)
    assert shedding.wait_ahead_s() == pytest.approx(2 * START_WEIGHT * 0.1)  # two to start
    shedding.began(c)
    shedding.began(d)
    assert shedding.wait_ahead_s() == pytest.approx(0.0, abs=1e-9)
    shedding.began(object())  # never handed over here: nothing to take
    assert shedding.spawned_at == {}


def test_a_submit_is_refused_as_accepted_while_the_wait_ahead_passes_half_the_bound(
        connected: tuple[socket.socket, socket.socket]) -> None:
    server = arrived(connected, submit())
    ticks = Ticks()
    judged = Judged(bound_ms=300)  # the loop on time, the bytes fresh
    shedding = AcceptShedding(judged.shedder, clock=ticks)
    shedding.spawned(object())
    ticks.now += 0.14  # under half the bound: let in
    assert not shedding.pressed() and not accepted(shedding, server)
    ticks.now += 0.02  # past it
    assert shedding.pressed() and accepted(shedding, server)
    assert judged.sheds == [REASON_WAIT_AHEAD]


def test_a_read_is_let_in_whatever_the_wait_ahead(
        connected: tuple[socket.socket, socket.socket]) -> None:
    server = arrived(connected, GET)
    ticks = Ticks()
    judged = Judged()
    shedding = AcceptShedding(judged.shedder, clock=ticks)
    shedding.spawned(object())
    ticks.now += 10.0
    assert shedding.pressed() and not accepted(shedding, server)
    assert judged.sheds == []


def drain_server(lag_s: float) -> tuple[Any, Judged, list[bytes]]:
    """A started accept-shedding server handling inline (what it handed over is in the
    list, as sent), and its judge."""
    judged = Judged(lag_s=lag_s)
    handed: list[bytes] = []
    server = accept_shedding_server(StreamServer, AcceptShedding(judged.shedder))(
        ("127.0.0.1", 0), handle=lambda sock, _address: handed.append(sock.recv(PEEK_BYTES)),
        spawn=None)
    server.init_socket()
    return server, judged, handed


def queue_up(server: Any, sent: list[bytes]) -> list[socket.socket]:
    """New connections to ``server`` that sent ``sent``: in its accept queue once
    they are connected (loopback)."""
    clients = [socket.create_connection(server.address) for _ in sent]
    for client, data in zip(clients, sent, strict=True):
        client.sendall(data)
    wait_until(lambda: (listen_queue(server.socket) or (0, 0))[0] == len(sent), 5,
               "the connections queued for accept")
    return clients


def test_a_request_starting_drains_the_accept_queue_while_pressed() -> None:
    server, judged, handed = drain_server(lag_s=1.0)
    server.start()
    try:
        assert server.drain in judged.shedder.before_request  # run as each request starts
        clients = queue_up(server, [submit(), GET, submit()])
        judged.shedder({"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz"},
                       lambda *_: None)  # a request starts: the queue is drained
        assert judged.sheds == [REASON_LAG, REASON_LAG]
        assert handed == [GET]  # a read is handed over, the submits refused unparsed
        found = listen_queue(server.socket)
        assert found is not None and found[0] == 0
    finally:
        for client in clients:
            client.close()
        server.close()
    assert server.drain not in judged.shedder.before_request


def test_a_calm_worker_drains_a_queue_that_built_up_and_sheds_nothing() -> None:
    server, judged, handed = drain_server(lag_s=0.0)
    clients = queue_up(server, [submit(), GET])
    try:
        server.drain()
        assert handed == [submit(), GET]  # handed over to wait in sight, not the kernel
        assert judged.sheds == []
        server.drain()  # nothing queued: nothing taken
        assert handed == [submit(), GET]
    finally:
        for client in clients:
            client.close()
        server.close()


def test_a_listener_that_defers_accept_queues_a_connection_once_it_sends() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        assert defer_accept(listener)
        listener.setblocking(False)
        with socket.create_connection(listener.getsockname()) as client:
            with pytest.raises(BlockingIOError):  # connected, silent: not queued yet
                listener.accept()
            client.sendall(submit())

            def taken() -> bool:
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    return False
                sock.close()
                return True

            wait_until(taken, 5, "the connection queued once its bytes arrived")


def test_a_unix_listener_is_left_as_it_is(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "web.sock"))
        assert not defer_accept(listener)


@pytest.mark.parametrize(("lag_s", "why"), [(0.14, None), (0.16, REASON_LAG)])
def test_a_submit_is_shed_once_the_lag_ahead_of_it_passes_half_the_bound(
        lag_s: float, why: str | None) -> None:
    """The lag is the wait still ahead of a request being judged (each of its later
    steps waits as long): half the bound is left for the wait it already had."""
    shedder = Judged(lag_s=lag_s, bound_ms=300).shedder
    assert shedder.reason({"REQUEST_METHOD": "POST", "PATH_INFO": "/submit"}) == why
    assert shedder.reason({"REQUEST_METHOD": "GET", "PATH_INFO": "/result/x"}) is None
