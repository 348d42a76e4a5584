"""A small response's head and first body part go in one send, as the same bytes
gunicorn's own response writes in two (web/common/one_send.py)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from gunicorn.http import wsgi

from web.common import one_send
from web.common.one_send import GATHER_MAX_BYTES, OneSendResponse

#: gunicorn stamps each head with the second it was written.
DATE = re.compile(rb"Date: [^\r]*\r\n")


@dataclass
class Request:
    """What gunicorn's response reads of its request."""

    method: str = "GET"
    version: tuple[int, int] = (1, 1)

    def should_close(self) -> bool:
        return False


class CountingSocket:
    """A real socket whose ``sendall`` calls are counted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sends = 0

    def sendall(self, data: bytes) -> None:
        self.sends += 1
        self.sock.sendall(data)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def written(cls: type[wsgi.Response], pair: tuple[socket.socket, socket.socket],
            headers: list[tuple[str, str]], parts: list[bytes], req: Request,
            status: str = "200 OK") -> tuple[bytes, int]:
    """The bytes ``cls`` writes for one answer, Date dropped, and the sends it took."""
    ours, theirs = pair
    sock = CountingSocket(ours)
    resp = cls(req, sock, SimpleNamespace(is_ssl=False, sendfile=False))
    resp.start_response(status, headers)
    for part in parts:
        resp.write(part)
    resp.close()
    ours.shutdown(socket.SHUT_WR)
    out = bytearray()
    while chunk := theirs.recv(1 << 20):
        out += chunk
    return DATE.sub(b"", bytes(out)), sock.sends


def both(headers: list[tuple[str, str]], parts: list[bytes], req: Request | None = None,
         status: str = "200 OK") -> tuple[tuple[bytes, int], tuple[bytes, int]]:
    """What gunicorn's response and ours write for the same answer."""
    answers = []
    for cls in (wsgi.Response, OneSendResponse):
        a, b = socket.socketpair()
        try:
            answers.append(written(cls, (a, b), headers, parts, req or Request(), status))
        finally:
            a.close()
            b.close()
    return answers[0], answers[1]


def test_a_small_answer_goes_in_one_send_as_the_same_bytes() -> None:
    body = b'{"id":"j1","status":"done"}\n'
    (theirs, their_sends), (ours, our_sends) = both(
        [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], [body])
    assert ours == theirs and ours.endswith(b"\r\n\r\n" + body)
    assert (their_sends, our_sends) == (2, 1)


def test_a_body_over_the_gather_bound_is_not_copied_into_the_head() -> None:
    body = b"x" * (GATHER_MAX_BYTES + 1)
    (theirs, their_sends), (ours, our_sends) = both(
        [("Content-Length", str(len(body)))], [body])
    assert ours == theirs and our_sends == their_sends == 2


def test_a_chunked_stream_sends_its_head_with_the_first_chunk_only() -> None:
    parts = [b"data: 1\n\n", b"data: 2\n\n"]
    (theirs, their_sends), (ours, our_sends) = both([("Content-Type", "text/event-stream")],
                                                    parts)
    assert ours == theirs and b"Transfer-Encoding: chunked" in ours
    # gunicorn: head, two chunks, the last chunk; here the head rides with the first.
    assert (their_sends, our_sends) == (4, 3)


@pytest.mark.parametrize(("method", "status"), [("HEAD", "200 OK"), ("GET", "204 No Content")])
def test_a_body_gunicorn_omits_is_omitted(method: str, status: str) -> None:
    (theirs, _), (ours, our_sends) = both([("Content-Length", "5")], [b"hello"],
                                          Request(method=method), status)
    assert ours == theirs and not ours.endswith(b"hello") and our_sends == 1


def test_a_body_longer_than_its_content_length_is_cut_as_gunicorn_cuts_it() -> None:
    (theirs, _), (ours, our_sends) = both([("Content-Length", "3")], [b"hello", b"more"])
    assert ours == theirs and ours.endswith(b"\r\n\r\nhel") and our_sends == 1


def test_an_empty_answer_sends_its_head_once() -> None:
    (theirs, their_sends), (ours, our_sends) = both([("Content-Length", "0")], [])
    assert ours == theirs and their_sends == our_sends == 1


def test_what_was_gathered_is_sent_when_gunicorn_raises(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: wsgi.Response, data: bytes) -> None:
        raise OSError("the body's framing failed")

    monkeypatch.setattr(wsgi.Response, "_emit_body", broken)
    ours, theirs = pair
    resp = OneSendResponse(Request(), CountingSocket(ours),
                           SimpleNamespace(is_ssl=False, sendfile=False))
    resp.start_response("200 OK", [("Content-Length", "2")])
    with pytest.raises(OSError, match="framing"):
        resp.write(b"ok")
    assert resp.sock.sock is ours  # the real socket is back
    assert theirs.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")


def test_installing_replaces_gunicorns_response_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wsgi, "Response", wsgi.Response)  # restored after the test
    assert one_send.install() is True
    assert wsgi.Response is OneSendResponse
    assert one_send.install() is False
