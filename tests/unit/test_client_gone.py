"""The check a waiting request makes that its client is still there (web/results/polls.py),
on real sockets: a web process serving a thousand connections has descriptors past
``select.select``'s 1023, and a caller still waiting there must not read as gone."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Iterator

import pytest

from web.results.polls import client_gone_check

#: Past FD_SETSIZE (1024): where ``select.select`` raises ValueError.
HIGH_FD = 1500


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(server side, client side) of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    yield server, client
    server.close()
    client.close()


@pytest.fixture
def high(pair: tuple[socket.socket, socket.socket]) -> Iterator[tuple[socket.socket,
                                                                       socket.socket]]:
    """The same connection, its server side moved to descriptor ``HIGH_FD``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH_FD:
        pytest.skip(f"this machine allows only {hard} open files")
    if soft != resource.RLIM_INFINITY and soft <= HIGH_FD:
        resource.setrlimit(resource.RLIMIT_NOFILE, (HIGH_FD + 1, hard))
    server, client = pair
    os.dup2(server.fileno(), HIGH_FD)
    moved = socket.socket(fileno=HIGH_FD)
    try:
        yield moved, client
    finally:
        moved.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def check(sock: socket.socket) -> bool:
    gone = client_gone_check({"gunicorn.socket": sock})
    assert gone is not None
    return gone()


def test_a_waiting_client_is_there_and_a_closed_one_gone(
        pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    assert not check(server)
    client.close()
    assert check(server)


def test_a_client_on_a_descriptor_past_1023_is_not_taken_for_gone(
        high: tuple[socket.socket, socket.socket]) -> None:
    server, client = high
    assert server.fileno() == HIGH_FD
    assert not check(server)
    client.close()
    assert check(server)


def test_a_pipelined_request_is_not_an_end(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    client.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    assert not check(server)
    assert server.recv(3, socket.MSG_PEEK) == b"GET"  # left for the next request


def test_a_reset_connection_is_gone(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()  # linger 0: an RST, not a FIN
    assert check(server)


def test_no_socket_handed_over_gives_no_check() -> None:
    assert client_gone_check({}) is None
