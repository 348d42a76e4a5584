"""Shedding at accept (web/common/accept_shedding.py): what it reads of a request still in
the kernel's buffer, and what it does to a real loopback TCP connection."""

from __future__ import annotations

import json
import os
import socket

import pytest
from gevent.server import StreamServer

from carpool.stack.waiting import wait_until
from web.common.accept_shedding import (
    ACCEPT_BURST,
    PEEK_BYTES,
    AcceptShedding,
    accept_shedding_server,
)
from web.common.backlog import data_age_ms
from web.common.peeked import PeekedRequest, whole_request
from web.common.shedding import (
    REASON_LAG,
    REASON_QUEUED,
    LagMonitor,
    Shedder,
)

BODY = b'{"model": "synthetic", "input": {"value": 1, "size": 1}}'
OLD_STAMP = "t=1000000000"  # 2001: any bound has passed


def submit(path: str = "/submit?wait=30", body: bytes = BODY, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_a_whole_submit_is_read_with_its_length_and_path_without_the_query() -> None:
    data = submit()
    assert whole_request(data + b"GET /") == PeekedRequest("POST", "/submit", len(data), True)


def test_a_request_without_a_body_ends_at_its_head() -> None:
    data = b"GET /healthz HTTP/1.0\r\nHost: h\r\n\r\nGET /next"
    assert whole_request(data) == PeekedRequest("GET", "/healthz", len(data) - 9, False)


def test_header_names_are_read_whatever_their_case() -> None:
    data = submit().replace(b"Content-Length: ", b"content-LENGTH:  ")
    assert whole_request(data) == PeekedRequest("POST", "/submit", len(data), True)


@pytest.mark.parametrize(("version", "connection", "keep_alive"), [
    (b"HTTP/1.1", b"", True),
    (b"HTTP/1.1", b"Connection: close\r\n", False),
    (b"HTTP/1.1", b"connection: Upgrade, CLOSE\r\n", False),
    (b"HTTP/1.1", b"Connection: keep-alive\r\nConnection: close\r\n", False),
    (b"HTTP/1.0", b"", False),
    (b"HTTP/1.0", b"Connection: Keep-Alive\r\n", True),
])
def test_whether_the_client_keeps_the_connection_follows_its_version_and_options(
        version: bytes, connection: bytes, keep_alive: bool) -> None:
    data = submit(extra=connection.decode()).replace(b"HTTP/1.1", version)
    found = whole_request(data)
    assert found is not None and found.keep_alive is keep_alive


@pytest.mark.parametrize("data", [
    b"",
    submit()[:-1],  # the body's last byte has not arrived
    submit().split(b"\r\n\r\n")[0],  # the head has not ended
    submit(extra="Transfer-Encoding: chunked\r\n"),  # chunked: gunicorn reads it
    submit().replace(b"Content-Length: ", b"Content-Length: -"),
    submit().replace(b"Content-Length: ", b"Content-Length: 0x"),
    submit().replace(b"Content-Length: 56", b"Content-Length: 5 6"),
    submit(extra="Content-Length: 3\r\n"),  # two lengths: gunicorn refuses it
    submit().replace(b"Content-Length: 56", b"Content-Length: " + b"9" * 40),
    submit().replace(b"Host: h", b"Host h"),  # a field without a colon
    submit().replace(b" HTTP/1.1", b" HTTP/2.0"),
    submit().replace(b" HTTP/1.1", b""),  # HTTP/0.9
    submit().replace(b"POST /submit", b"POST  /submit"),  # not three parts
    submit(path="/sub\u00e9mit"),  # not ASCII (sent as UTF-8)
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2's preface
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS ClientHello
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n" + submit(),  # a PROXY protocol line
    # Framed otherwise by a lenient reader, refused by gunicorn: never answered here.
    submit().replace(b"Content-Length:", b"Content-Length :"),
    submit().replace(b"Content-Length:", b"Content-Length\t:"),
    submit(extra="X-A: 1\r\n  folded\r\n"),  # obs-fold
    submit().replace(b"Host: h\r\n", b"Host: h\n"),  # a bare LF
    submit().replace(b"Host: h\r\n", b"Host: h\rX: 1\r\n"),  # a bare CR
    submit().replace(b"POST /submit", b"P(ST /submit"),  # a method that is not a token
    submit().replace(b"HTTP/1.1", b"HTTP/1.2"),
    b"\r\n\r\n",
    b"\x00" * 100,
])
def test_anything_but_a_whole_plain_request_is_left_to_gunicorn(data: bytes) -> None:
    assert whole_request(data) is None


def accepted(shedding: AcceptShedding, sock: socket.socket) -> bool:
    """What the accept loop does with ``sock``: True when it refused it."""
    verdict = shedding.verdict(sock)
    if verdict is not None:
        shedding.refuse(sock, verdict)
    return verdict is not None


class Judged:
    """A real Shedder whose event loop is as late as a test says."""

    def __init__(self, lag_s: float = 0.0, bound_ms: int = 300) -> None:
        self.sheds: list[str] = []
        self.refusals: list[float] = []
        clock = [100.0]
        monitor = LagMonitor(clock=lambda: clock[0])
        monitor.woke(clock[0] - monitor.interval_s - lag_s, clock[0])
        self.shedder = Shedder(lambda environ, start: [b""], bound_ms, monitor,
                               self.sheds.append, self.refusals.append,
                               clock=lambda: clock[0])


def wait_readable(sock: socket.socket, data_len: int) -> None:
    """Until ``data_len`` bytes sent by the other end are in ``sock``'s buffer (bounded)."""
    sock.settimeout(5)
    got = b""
    while len(got) < data_len:
        got = sock.recv(data_len, socket.MSG_PEEK | socket.MSG_WAITALL)


def arrived(connected: tuple[socket.socket, socket.socket], data: bytes) -> socket.socket:
    """The server's end of ``connected`` once ``data``, sent by the client, is in its buffer."""
    client, server = connected
    client.sendall(data)
    wait_readable(server, len(data))
    return server


def test_a_submit_to_shed_is_answered_503_read_out_and_closed(
        connected: tuple[socket.socket, socket.socket]) -> None:
    client = connected[0]
    server = arrived(connected, submit())
    judged = Judged(lag_s=1.0)
    assert accepted(AcceptShedding(judged.shedder), server)
    assert server.fileno() == -1  # closed
    client.settimeout(5)
    answer = b""
    while chunk := client.recv(65536):  # the server closed after writing: EOF, no reset
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    assert {b"Retry-After: 1", b"Connection: close", b"Content-Type: application/json",
            f"Content-Length: {len(body)}".encode()} <= set(lines[1:])
    assert json.loads(body)["error"]["code"] == "overloaded"
    assert judged.sheds == [REASON_LAG]
    assert len(judged.refusals) == 1 and judged.refusals[0] >= 0


@pytest.mark.parametrize(("data", "lag_s"), [
    (submit()[:-3], 1.0),  # not wholly arrived
    (submit() + submit(), 1.0),  # pipelined: the second would be left unread
    (b"GET /result/abc?wait=30 HTTP/1.1\r\nHost: h\r\n\r\n", 1.0),  # admits nothing
    (submit(path="/metrics"), 1.0),
    (submit(), 0.0),  # fresh, and the loop on time
    # A proxy's stamp alone: the judge in front of Flask reads it; nothing is read here.
    (submit(extra=f"X-Request-Start: {OLD_STAMP}\r\n"), 0.0),
])
def test_a_connection_not_to_shed_here_is_left_untouched(
        connected: tuple[socket.socket, socket.socket], data: bytes, lag_s: float) -> None:
    server = arrived(connected, data)
    judged = Judged(lag_s=lag_s)
    assert not accepted(AcceptShedding(judged.shedder), server)
    assert server.recv(PEEK_BYTES, socket.MSG_PEEK) == data  # all still there for gunicorn
    assert judged.sheds == [] and judged.refusals == []


def test_a_connection_with_nothing_sent_yet_is_left_to_gunicorn(
        connected: tuple[socket.socket, socket.socket]) -> None:
    _, server = connected
    judged = Judged(lag_s=5.0)
    assert not accepted(AcceptShedding(judged.shedder), server)
    assert server.fileno() != -1
    assert judged.sheds == []


def test_a_late_event_loop_sheds_a_fresh_submit_and_takes_connections_in_bursts(
        connected: tuple[socket.socket, socket.socket]) -> None:
    server = arrived(connected, submit())
    late = Judged(lag_s=1.0)
    shedding = AcceptShedding(late.shedder)
    assert shedding.connections_per_turn(1) == ACCEPT_BURST
    assert shedding.connections_per_turn(100) == 100  # gevent's own, with one worker
    assert AcceptShedding(Judged().shedder).connections_per_turn(1) == 1
    assert accepted(shedding, server)
    assert late.sheds == [REASON_LAG]


def test_shedding_off_takes_one_connection_a_turn_and_sheds_nothing(
        connected: tuple[socket.socket, socket.socket]) -> None:
    data = submit(extra=f"X-Request-Start: {OLD_STAMP}\r\n")
    server = arrived(connected, data)
    off = Judged(lag_s=5.0, bound_ms=0)
    shedding = AcceptShedding(off.shedder)
    assert shedding.connections_per_turn(1) == 1
    assert not accepted(shedding, server)
    assert off.sheds == []


def test_bytes_that_waited_over_the_bound_are_shed_on_a_calm_loop(
        connected: tuple[socket.socket, socket.socket]) -> None:
    server = arrived(connected, submit())
    calm = Judged(bound_ms=1)
    wait_until(lambda: (data_age_ms(server) or 0) > 1, 5, "the request's bytes aging")
    assert accepted(AcceptShedding(calm.shedder), server)
    assert calm.sheds == [REASON_QUEUED]


GET = b"GET /result/abc HTTP/1.1\r\nHost: h\r\n\r\n"


def one_turn(lag_s: float, sent: list[bytes]) -> tuple[list[bytes], int, list[str]]:
    """One turn of gevent's own accept loop over new connections that sent ``sent``, in
    order: (what the connections handed over to the handler sent, how many are still
    to be accepted, the sheds)."""
    judged = Judged(lag_s=lag_s)
    shedding = AcceptShedding(judged.shedder)
    handed: list[bytes] = []
    server = accept_shedding_server(StreamServer, shedding)(
        ("127.0.0.1", 0), handle=lambda sock, _address: handed.append(sock.recv(PEEK_BYTES)),
        spawn=None)  # handled inline, so the turn's outcome is known when it returns
    server.init_socket()
    server.max_accept = 1  # what gunicorn sets with several workers
    clients = [socket.create_connection(server.address) for _ in sent]
    try:
        for client, data in zip(clients, sent, strict=True):
            client.sendall(data)  # on loopback: in the server's buffer once sent
        server._do_read()  # one turn, as the event loop runs it when the socket is ready
        left = 0
        while True:
            try:
                fd, _ = server.socket._accept()  # the kernel's socket under gevent's
            except BlockingIOError:
                break
            os.close(fd)
            left += 1
        return handed, left, judged.sheds
    finally:
        for client in clients:
            client.close()
        server.close()


def test_an_overloaded_turn_sheds_in_a_burst_but_hands_over_only_its_calm_share() -> None:
    sent = [submit(), submit(), GET, submit(), GET, submit()]
    handed, left, sheds = one_turn(1.0, sent)
    assert sheds == [REASON_LAG, REASON_LAG]  # the two submits ahead of the first GET
    assert handed == [GET]  # one, as a calm turn; then the turn ends
    assert left == 3


def test_a_calm_turn_takes_one_connection_and_sheds_nothing() -> None:
    handed, left, sheds = one_turn(0.0, [submit(), submit(), GET])
    assert handed == [submit()]
    assert left == 2
    assert sheds == []


def test_an_overloaded_turn_sheds_up_to_its_burst() -> None:
    handed, left, sheds = one_turn(1.0, [submit()] * (ACCEPT_BURST + 3))
    assert handed == []
    assert len(sheds) == ACCEPT_BURST
    assert left == 3


def test_a_failure_in_shedding_hands_the_connection_to_gunicorn(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(_self: AcceptShedding, _client: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(AcceptShedding, "verdict", broken)
    handed, left, sheds = one_turn(1.0, [submit(), submit()])
    assert handed == [submit()]  # served, and the loop goes on accepting
    assert left == 1
    assert "shedding at accept failed" in caplog.text


def test_a_failure_counting_a_shed_still_answers_and_keeps_it_from_gunicorn(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(_self: Shedder, _why: str, _waited_s: float) -> None:
        raise RuntimeError("the metrics' files are gone")

    monkeypatch.setattr(Shedder, "shed", broken)
    handed, left, sheds = one_turn(1.0, [submit(), GET])
    assert handed == [GET]  # the submit was answered and closed, never handed over
    assert left == 0
    assert "counting a shed before gunicorn failed" in caplog.text


def test_an_overload_check_that_fails_leaves_the_turn_calm(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(_self: Shedder) -> bool:
        raise RuntimeError("boom")

    monkeypatch.setattr(Shedder, "overloaded", broken)
    shedding = AcceptShedding(Judged().shedder)
    server = accept_shedding_server(StreamServer, shedding)(
        ("127.0.0.1", 0), handle=lambda _sock, _address: None)
    server.max_accept = 1
    assert server.max_accept == 1
    assert "judging overload at accept failed" in caplog.text


def test_a_request_longer_than_the_peek_is_left_to_gunicorn(
        connected: tuple[socket.socket, socket.socket]) -> None:
    client, server = connected
    overhead = len(submit(body=b"x" * 10_000)) - 10_000  # a five-digit length's head
    whole = submit(body=b"x" * (PEEK_BYTES - overhead))
    assert len(whole) == PEEK_BYTES and whole_request(whole) is not None
    data = whole + b"more"  # exactly what is looked at, then more
    client.sendall(data)
    wait_readable(server, len(data))
    assert not accepted(AcceptShedding(Judged(lag_s=1.0).shedder), server)
