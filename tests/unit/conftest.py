"""Unit tests need no Redis: a connection opened by one, through any fixture or
object, fails the test with where it belongs. Without a Redis client installed (the
GPU machine's image) there is nothing to refuse."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import redis.connection
    except ImportError:
        return

    def refuse(self: redis.connection.AbstractConnection, *args: Any, **kwargs: Any) -> None:
        pytest.fail("a test under tests/unit connected to Redis: it belongs in tests/redis")

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", refuse)


@pytest.fixture
def connected() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the client's end, the server's end just accepted) of a loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            yield client, server
