"""Long-polls: how many one client may hold open, and whether its client is still there.

A long-poll holds a connection slot of its web process for up to ``?wait=`` seconds.
Two rules keep polls from taking every slot (so /healthz and submits still get one):

- a client holds at most ``CARPOOL_MAX_POLLS_PER_CLIENT`` polls in one process at
  once; more answer 429 with ``Retry-After``. A client is its API key when keys are
  on, else its address (behind a proxy, give the proxy the cap it needs);
- a poll ends as soon as its client closes the connection: it looks at the socket
  every ``CLIENT_CHECK_S`` while it waits, so a client that sends thousands of polls
  and drops them holds their slots for about a second, not for their ``wait``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from carpool.backend.connection import readable_now
from carpool.core.errors import CarpoolError

#: How often a waiting poll looks whether its client has gone.
CLIENT_CHECK_S = 1.0

#: True once the client that sent the request has closed its connection.
ClientGone = Callable[[], bool]


class TooManyPolls(CarpoolError):
    """Raised when a client already holds as many long-polls as one process allows it."""


class PollCounter:
    """Each client's open long-polls in this process, capped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, client: str) -> Iterator[None]:
        """One poll of ``client`` while the block runs; TooManyPolls over the cap."""
        with self._lock:
            held = self._held.get(client, 0)
            if held >= self.cap:
                raise TooManyPolls(
                    f"this client already holds {held} long-polls open in this process "
                    f"(CARPOOL_MAX_POLLS_PER_CLIENT); retry when one has ended")
            self._held[client] = held + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held[client] - 1
                if left:
                    self._held[client] = left
                else:
                    del self._held[client]

    def held(self, client: str) -> int:
        with self._lock:
            return self._held.get(client, 0)


def client_gone_check(environ: Mapping[str, Any]) -> ClientGone | None:
    """A check that the request's client closed its connection; None where the server
    does not hand over the socket (gunicorn does, as ``gunicorn.socket``)."""
    sock = environ.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return None

    def gone() -> bool:
        try:
            # Readable while a request waits: end of stream (b""), or a pipelined request.
            return readable_now(sock) and sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # reset, or already closed (fileno -1)
            return True

    return gone
