"""Shedding at accept, under pressure (web/common/accept_shedding.py): the wait ahead of
a connection, the accept queue drained as each request starts, a listener that defers
accept, and the lag's half of the bound."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import gevent
import pytest
from gevent.pool import Pool
from gevent.server import StreamServer

from carpool.stack.waiting import wait_until
from tests.unit.test_accept_shedding import GET, Judged, accepted, arrived, submit
from web.common.accept_shedding import (
    FORGET_UNSTARTED_S,
    MAX_START_INTERVAL_S,
    PEEK_BYTES,
    START_HALF_LIFE_S,
    START_WEIGHT,
    AcceptShedding,
    accept_shedding_server,
    defer_accept,
)
from web.common.backlog import MIN_LISTEN_QUEUE, listen_queue
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
    ticks.now += 0.005
    shedding.spawned(b)
    ticks.now += 0.005
    assert shedding.wait_ahead_s() == pytest.approx(0.01)  # a, handed over 10 ms ago
    shedding.began(a)
    ticks.now += 0.01
    shedding.began(b)  # b waited while a started, and started 10 ms after it: the pace
    shedding.spawned(c)
    shedding.spawned(d)
    assert shedding.wait_ahead_s() == pytest.approx(2 * START_WEIGHT * 0.01)  # two to start
    shedding.began(c)
    shedding.began(d)
    assert shedding.wait_ahead_s() == pytest.approx(0.0, abs=1e-9)
    shedding.began(object())  # never handed over here: nothing to take
    assert shedding.spawned_at == {}


def paced(shedding: AcceptShedding, ticks: Ticks, gap_s: float) -> None:
    """Two handed-over connections, the second starting ``gap_s`` after the first."""
    first, second = object(), object()
    shedding.spawned(first)
    shedding.spawned(second)
    ticks.now += 0.001
    shedding.began(first)
    ticks.now += gap_s
    shedding.began(second)


def test_one_long_gap_between_starts_is_capped_and_a_calm_spell_forgets_the_pace() -> None:
    ticks = Ticks()
    shedding = AcceptShedding(Judged().shedder, clock=ticks)
    paced(shedding, ticks, gap_s=1.5)  # a GC pause between two starts
    ahead = object()
    shedding.spawned(ahead)
    assert shedding.wait_ahead_s() == pytest.approx(START_WEIGHT * MAX_START_INTERVAL_S)
    shedding.began(ahead)
    ticks.now += 10 * START_HALF_LIFE_S  # calm
    shedding.spawned(ahead)
    assert shedding.wait_ahead_s() < START_WEIGHT * MAX_START_INTERVAL_S / 1000


def test_a_connection_never_started_stops_counting_as_ahead() -> None:
    ticks = Ticks()
    shedding = AcceptShedding(Judged().shedder, clock=ticks)
    shedding.spawned(object())  # its handler killed unstarted, by a stop
    ticks.now += FORGET_UNSTARTED_S + 1
    assert shedding.wait_ahead_s() == pytest.approx(0.0, abs=1e-9)
    assert not shedding.pressed()


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


class Drained:
    """An accept-shedding server taking one connection a turn (gunicorn's share with
    several workers), handling inline unless ``spawn`` is given; its judge, its
    shedding, and what it handed over (as sent)."""

    def __init__(self, lag_s: float, spawn: Any = None) -> None:
        self.judged = Judged(lag_s=lag_s)
        self.shedding = AcceptShedding(self.judged.shedder)
        self.handed: list[bytes] = []
        self.server = accept_shedding_server(StreamServer, self.shedding)(
            ("127.0.0.1", 0),
            handle=lambda sock, _address: self.handed.append(sock.recv(PEEK_BYTES)),
            spawn=spawn)
        self.server.max_accept = 1
        self.server.init_socket()


def queue_up(server: Any, sent: list[bytes]) -> list[socket.socket]:
    """New connections to ``server`` that sent ``sent``: in its accept queue once
    they are connected (loopback)."""
    clients = [socket.create_connection(server.address) for _ in sent]
    for client, data in zip(clients, sent, strict=True):
        client.sendall(data)
    wait_until(lambda: queued(server) == len(sent), 5, "the connections queued for accept")
    return clients


def queued(server: Any) -> int:
    found = listen_queue(server.socket)
    assert found is not None
    return found[0]


def request_starts(judged: Judged) -> None:
    judged.shedder({"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz"}, lambda *_: None)


def test_a_request_starting_drains_the_accept_queue_while_pressed() -> None:
    d = Drained(lag_s=1.0)
    server, judged, handed = d.server, d.judged, d.handed
    server.start()
    clients = queue_up(server, [submit(), GET, submit(), GET])
    try:
        assert server.drain in judged.shedder.before_request  # run as each request starts
        request_starts(judged)
        assert judged.sheds == [REASON_LAG]  # refused unparsed
        assert handed == [GET]  # a read is handed over: a calm turn's share, then it stops
        assert queued(server) == 2
        request_starts(judged)
        assert judged.sheds == [REASON_LAG, REASON_LAG] and handed == [GET, GET]
        assert queued(server) == 0
    finally:
        for client in clients:
            client.close()
        server.close()
    assert server.drain not in judged.shedder.before_request


def test_a_calm_worker_leaves_a_short_queue_to_the_loop_and_takes_its_share_of_a_long_one(
        ) -> None:
    d = Drained(lag_s=0.0)
    server, judged, handed = d.server, d.judged, d.handed
    clients = queue_up(server, [submit()] * (MIN_LISTEN_QUEUE - 1))
    try:
        server.drain()
        assert handed == []  # a few queued: the loop's turn takes them
        clients.append(socket.create_connection(server.address))
        clients[-1].sendall(GET)
        wait_until(lambda: queued(server) == MIN_LISTEN_QUEUE, 5, "a pile-up")
        server.drain()
        assert handed == [submit()] and judged.sheds == []  # one, as a calm turn
    finally:
        for client in clients:
            client.close()
        server.close()


def test_every_connection_handed_to_a_pool_is_seen_to_start() -> None:
    d = Drained(lag_s=1.0, spawn=Pool(10))
    clients = queue_up(d.server, [GET, GET])
    try:
        d.server.drain()
        d.server.drain()
        assert len(d.shedding.spawned_at) == 2  # handed over, not started yet
        wait_until(lambda: gevent.sleep(0.01) or len(d.handed) == 2, 5, "both reads handled")
        assert d.shedding.spawned_at == {}
    finally:
        for client in clients:
            client.close()
        d.server.close()


def test_a_spawn_that_fails_leaves_no_connection_counted_ahead(
        caplog: pytest.LogCaptureFixture) -> None:
    def refused(*_args: Any) -> None:
        raise RuntimeError("no greenlet for it")

    d = Drained(lag_s=1.0, spawn=refused)
    clients = queue_up(d.server, [GET])
    try:
        d.server.drain()
        assert d.shedding.spawned_at == {}
        assert "draining the accept queue failed" in caplog.text
    finally:
        for client in clients:
            client.close()
        d.server.close()


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
