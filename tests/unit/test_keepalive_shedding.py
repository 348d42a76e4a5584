"""Shedding between requests (web/common/keepalive_shedding.py): gunicorn's own request
parser on a real loopback TCP connection, the web calm or late as a test says."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import gevent
import gevent.socket
import pytest
from gunicorn import http
from gunicorn.config import Config
from gunicorn.http.errors import NoMoreData

from tests.unit.test_accept_shedding import BODY, GET, Judged, arrived, submit
from web.common import keepalive_shedding
from web.common.accept_shedding import AcceptShedding
from web.common.keepalive_shedding import (
    KeepAliveTimeouts,
    PressureReading,
    SheddingParser,
    parser_class,
)
from web.common.shedding import REASON_LAG

Connected = tuple[socket.socket, socket.socket]


class Served:
    """A server's end read by a worker's ``SheddingParser``, its web late as ``late``."""

    def __init__(self, server: socket.socket, worker: Any = None) -> None:
        self.judged = Judged()
        self.shedding = AcceptShedding(self.judged.shedder)
        self.parser = parser_class(self.shedding, None, worker)(Config(), server,
                                                                ("127.0.0.1", 1))

    def late(self, lag_s: float = 1.0) -> None:
        """The event loop is ``lag_s`` late from now (the test's clock stands still)."""
        monitor = self.judged.shedder.monitor
        now = monitor._clock()
        monitor.woke(now - monitor.interval_s - lag_s, now)
        self.parser.reading.ttl_s = 0  # read the pressure afresh

    def request(self) -> Any:
        """The next request, as gunicorn's keep-alive loop takes it."""
        return next(self.parser)


def answer_then_eof(client: socket.socket) -> tuple[list[bytes], bytes]:
    client.settimeout(5)
    answer = b""
    while chunk := client.recv(65536):  # the server closed after writing: EOF, no reset
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n"), body


def test_a_calm_web_leaves_every_request_of_a_connection_to_gunicorn(
        connected: Connected) -> None:
    client, server = connected
    served = Served(arrived(connected, submit()))
    first = served.request()
    assert (first.method, first.path) == ("POST", "/submit")
    first.body.read()
    arrived(connected, submit(path="/submit?wait=1"))
    second = served.request()
    assert (second.method, second.query) == ("POST", "wait=1")
    assert served.judged.sheds == [] and server.fileno() != -1


def read_answer(client: socket.socket) -> tuple[list[bytes], bytes]:
    """(the head's lines, the body) of one answer on a connection kept open."""
    client.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b": ")[1]) for line in lines
                  if line.startswith(b"Content-Length: "))
    while len(body) < length:
        body += client.recv(65536)
    assert len(body) == length, body  # nothing of another answer after it
    return lines, body


def test_the_next_submit_under_pressure_is_answered_503_and_the_connection_kept(
        connected: Connected) -> None:
    """Refused unparsed, read out, the connection kept: the request after it (a read,
    sent once the 503 is read) is gunicorn's to parse."""
    client, server = connected
    served = Served(arrived(connected, submit()))
    served.request().body.read()
    served.late()
    answers: list[tuple[list[bytes], bytes]] = []

    def client_side() -> None:
        client.sendall(submit())
        answers.append(read_answer(client))
        client.sendall(GET)

    sending = threading.Thread(target=client_side)
    sending.start()
    after = served.request()  # waits through the refusal for the read
    sending.join(5)
    assert (after.method, after.path) == ("GET", "/result/abc")
    (lines, body), = answers
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    assert {b"Retry-After: 1", b"Connection: keep-alive"} <= set(lines[1:])
    assert json.loads(body)["error"]["code"] == "overloaded"
    assert served.judged.sheds == [REASON_LAG]
    assert len(served.judged.refusals) == 1 and server.fileno() != -1


@pytest.mark.parametrize(("version", "extra", "alive"), [
    ("HTTP/1.1", "Connection: close\r\n", True),  # the client asked for it
    ("HTTP/1.0", "", True),  # without keep-alive
    ("HTTP/1.1", "", False),  # its worker is shutting down
])
def test_a_refused_submit_closes_the_connection_when_it_cannot_be_kept(
        connected: Connected, version: str, extra: str, alive: bool) -> None:
    client, server = connected
    served = Served(arrived(connected, submit()), SimpleNamespace(alive=alive))
    served.request().body.read()
    served.late()
    arrived(connected, submit(extra=extra).replace(b"HTTP/1.1", version.encode()))
    with pytest.raises(StopIteration):
        served.request()
    assert server.fileno() == -1
    lines, body = answer_then_eof(client)
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    assert b"Connection: close" in lines
    assert json.loads(body)["error"]["code"] == "overloaded"
    assert served.judged.sheds == [REASON_LAG]


def test_the_answered_requests_unread_body_is_read_out_before_the_next_is_judged(
        connected: Connected) -> None:
    """The app left the first submit's body unread: its bytes are not the next request."""
    client, _ = connected
    served = Served(arrived(connected, submit(body=b"x" * 20_000)))
    assert served.request().path == "/submit"  # its body still (mostly) in the socket
    served.late()
    client.sendall(submit(extra="Connection: close\r\n"))
    with pytest.raises(StopIteration):
        served.request()
    assert answer_then_eof(client)[0][0] == b"HTTP/1.1 503 Service Unavailable"
    assert served.judged.sheds == [REASON_LAG]


@pytest.mark.parametrize(("data", "path"), [
    (GET, "/result/abc"),  # admits nothing
    (submit(path="/metrics"), "/metrics"),
])
def test_a_next_request_not_to_shed_is_left_to_gunicorn(
        connected: Connected, data: bytes, path: str) -> None:
    _, server = connected
    served = Served(arrived(connected, submit()))
    served.request().body.read()
    served.late()
    arrived(connected, data)
    assert served.request().path == path
    assert served.judged.sheds == [] and server.fileno() != -1


def test_a_next_request_not_wholly_arrived_is_left_to_gunicorn(connected: Connected) -> None:
    client, _ = connected
    served = Served(arrived(connected, submit()))
    served.request().body.read()
    served.late()
    arrived(connected, submit()[:-3])
    pending = served.request()  # the head is read; the body's end is yet to come
    client.sendall(submit()[-3:])
    assert pending.path == "/submit" and pending.body.read() == BODY
    assert served.judged.sheds == []


class Peeks:
    """A socket that records the flags of every read from it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.flags: list[int] = []

    def recv(self, size: int, flags: int = 0) -> bytes:
        self.flags.append(flags)
        return self.sock.recv(size, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_connections_not_yet_started_shed_at_accept_but_not_a_running_handler(
        connected: Connected) -> None:
    """The wait ahead of a connection accepted now is no wait for a handler that runs:
    only the lag, the bytes' age or the accept queue shed a kept-alive one's request."""
    _, server = connected
    served = Served(arrived(connected, submit()))
    served.request().body.read()
    served.shedding.spawned_at[1] = time.monotonic() - 1.0  # one unstarted for 1 s
    served.parser.reading.ttl_s = 0
    assert served.shedding.pressed()
    arrived(connected, submit())
    assert served.shedding.verdict(server) is not None  # at accept: shed
    assert served.request().path == "/submit"
    assert served.judged.sheds == []


def test_a_request_gunicorn_read_ahead_is_left_to_it(connected: Connected) -> None:
    """Pipelined: the second request is in gunicorn's buffer, not the kernel's, whose
    buffer is not waited on."""
    peeks = Peeks(arrived(connected, submit() + submit(path="/submit?wait=2")))
    served = Served(peeks)  # type: ignore[arg-type]
    served.request().body.read()
    served.late()
    assert served.request().query == "wait=2"
    assert served.judged.sheds == []
    assert not any(flags & socket.MSG_PEEK for flags in peeks.flags), peeks.flags


def test_a_client_that_closes_under_pressure_ends_as_gunicorn_ends_it(
        connected: Connected) -> None:
    client, _ = connected
    served = Served(arrived(connected, submit()))
    served.request().body.read()
    served.late()
    client.close()
    with pytest.raises((StopIteration, NoMoreData)):
        served.request()
    assert served.judged.sheds == []


def test_a_failing_verdict_leaves_the_request_to_gunicorn_and_is_logged(
        connected: Connected, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    served = Served(arrived(connected, submit()))
    served.request().body.read()
    served.late()

    def broken(_sock: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(served.shedding, "verdict", broken)
    arrived(connected, submit())
    with caplog.at_level(logging.ERROR):
        assert served.request().path == "/submit"
    assert "shedding on a kept-alive connection failed" in caplog.text
    assert served.judged.sheds == []


class Counting:
    """Stands in for ``AcceptShedding``: how often its pressure is read."""

    def __init__(self) -> None:
        self.reads = 0

    def pressed(self) -> bool:
        self.reads += 1
        return self.reads % 2 == 1


def test_the_pressure_is_read_at_most_once_per_ttl() -> None:
    clock = [10.0]
    counting = Counting()
    reading = PressureReading(counting, ttl_s=0.005, clock=lambda: clock[0])  # type: ignore[arg-type]
    assert [reading.pressed() for _ in range(3)] == [True] * 3
    clock[0] += 0.005
    assert reading.pressed() is False
    assert counting.reads == 2


def test_install_parses_plain_connections_with_the_shedding_parser_once(
        connected: Connected, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "get_parser", http.get_parser)  # put back after the test
    _, server = connected
    shedding = AcceptShedding(Judged().shedder)
    worker = SimpleNamespace(cfg=Config(), alive=True)
    assert keepalive_shedding.install(shedding, worker)
    assert not keepalive_shedding.install(shedding, worker)
    parser = http.get_parser(Config(), server, ("127.0.0.1", 1))
    assert isinstance(parser, SheddingParser) and parser.reading.shedding is shedding
    assert parser.timeouts is not None and parser.timeouts.seconds == Config().keepalive
    assert worker.timeout_ctx == parser.timeouts.timeout_ctx
    tls = Config()
    tls.set("certfile", "cert.pem")
    assert type(http.get_parser(tls, server, ("127.0.0.1", 1))) is http.RequestParser
    assert type(http.get_parser(Config(), iter([b""]), None)) is http.RequestParser


#: A keep-alive timeout, and a wait of over half of it: two such outlast it.
KEEPALIVE_S = 0.5
WAIT_S = 0.3


def waited_through(restart: bool) -> bool:
    """Whether a greenlet waiting twice WAIT_S under one keep-alive timeout (restarted
    between, or not) got through both waits."""
    timeouts = KeepAliveTimeouts(KEEPALIVE_S)
    through: list[bool] = []

    def wait() -> None:
        gevent.get_hub().loop.update_now()  # sleeps count from now, not the loop's last turn
        with timeouts.timeout_ctx():  # silent on expiry, as gunicorn's
            gevent.sleep(WAIT_S)  # the client's pause, not a wait for work
            if restart:
                timeouts.restart()
            gevent.sleep(WAIT_S)
            through.append(True)
        assert timeouts.running == {}  # forgotten once the wait ends, either way

    gevent.spawn(wait).get(timeout=5)
    return through == [True]


def test_a_restarted_keep_alive_timeout_gives_the_connection_a_whole_wait_again() -> None:
    assert waited_through(restart=True)
    assert not waited_through(restart=False)


def test_refusals_restart_the_keep_alive_timeout_and_an_idle_connection_ends_at_it() -> None:
    """gevent sockets, as gunicorn's worker has them: two submits WAIT_S apart (longer
    together than one keep-alive timeout) are both refused on the connection kept
    open; once idle, the wait for the next request ends silently at the timeout."""
    server, client = gevent.socket.socketpair()
    with server, client:
        judged = Judged()
        timeouts = KeepAliveTimeouts(KEEPALIVE_S)
        parser = parser_class(AcceptShedding(judged.shedder), timeouts)(Config(), server, None)
        client.sendall(submit())
        with timeouts.timeout_ctx():
            next(parser).body.read()
        monitor = judged.shedder.monitor
        monitor.woke(monitor._clock() - monitor.interval_s - 1.0, monitor._clock())
        parser.reading.ttl_s = 0
        answers: list[list[bytes]] = []

        def client_side() -> None:
            client.settimeout(KEEPALIVE_S * 4)
            for _ in range(2):
                gevent.sleep(WAIT_S)  # the client's pause between requests
                client.sendall(submit())
                answers.append(read_answer(client)[0])

        sending = gevent.spawn(client_side)
        after = None
        gevent.get_hub().loop.update_now()
        with timeouts.timeout_ctx():
            after = next(parser)  # refuses twice, then waits idle until the timeout
        sending.join(5)
        assert after is None and timeouts.running == {}
        assert [lines[0] for lines in answers] == [b"HTTP/1.1 503 Service Unavailable"] * 2
        assert all(b"Connection: keep-alive" in lines for lines in answers), answers
        assert judged.sheds == [REASON_LAG] * 2
