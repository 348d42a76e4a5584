"""`carpool up`'s ports: a taken default is replaced by a free one (and said so); a
taken port that the user asked for is refused with the reason."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from carpool.core.errors import ConfigError
from carpool.stack.localstack import pick_port, port_problem


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
