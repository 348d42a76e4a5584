"""A small asyncio HTTP/1.1 keep-alive client: only what the bench needs, cheaply.

One ``asyncio.Protocol`` per connection, one request in flight on each, bodies
framed by Content-Length (what gunicorn sends for Flask's JSON answers). It
costs far less CPU per request than a general client, and the generator shares
two cores with the system it measures.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Idle connections older than this are dropped, not reused: gunicorn closes a
#: keep-alive connection after its ``keepalive`` (2 s by default), and a request
#: sent as the server closes would fail for no fault of the server.
IDLE_REUSE_S = 1.0


class ConnectionClosed(Exception):
    """Raised when the server closes a connection before answering in full."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = time.monotonic()
        self._buf = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._closed = False

    @property
    def usable(self) -> bool:
        return not self._closed and time.monotonic() - self.idle_since < IDLE_REUSE_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionClosed(str(exc or "closed by the server")))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        head_end = self._buf.find(b"\r\n\r\n")
        if head_end < 0 or self._waiter is None:
            return
        lines = bytes(self._buf[:head_end]).decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(self._buf) < head_end + 4 + length:
            return
        body = bytes(self._buf[head_end + 4 : head_end + 4 + length])
        del self._buf[: head_end + 4 + length]
        if headers.get("connection", "").lower() == "close":
            self._closed = True
        waiter, self._waiter = self._waiter, None
        if not waiter.done():
            waiter.set_result(Response(int(lines[0].split(" ", 2)[1]), headers, body))

    async def request(self, head: bytes, body: bytes) -> Response:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(head + body)
        try:
            return await self._waiter
        finally:
            self.idle_since = time.monotonic()

    def close(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """A pool of keep-alive connections to one host; at most ``max_connections`` open.

    With ``keep_alive=False`` each request opens a connection of its own and asks the
    server to close it (``Connection: close``), as a client without a session does."""

    def __init__(self, base_url: str, max_connections: int = 256,
                 extra_headers: dict[str, str] | None = None, keep_alive: bool = True) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url!r}: the bench speaks plain http://host:port only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        headers = {**(extra_headers or {}), **({} if keep_alive else {"Connection": "close"})}
        self.keep_alive = keep_alive
        self._host_header = f"Host: {self.host}:{self.port}\r\n".encode() + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()).encode()

    async def _connection(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        return conn

    async def request(
        self, method: str, path: str, body: bytes = b"", content_type: str = "application/json"
    ) -> Response:
        """Send one request; a connection the server closed unanswered is retried once.

        The retry is for a keep-alive connection the server closed while idle: it
        never read the request. Were a POST lost mid-request instead, the retry
        would queue a second job that nobody polls; the run's results stay right.
        """
        head = (
            f"{method} {path} HTTP/1.1\r\n".encode()
            + self._host_header
            + (f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n".encode()
               if body or method == "POST" else b"")
            + b"\r\n"
        )
        async with self._slots:
            for attempt in (1, 2):
                conn = await self._connection()
                try:
                    response = await conn.request(head, body)
                except asyncio.CancelledError:
                    conn.close()  # a client that gave up hangs up; the answer may still come
                    raise
                except ConnectionClosed:
                    conn.close()
                    if attempt == 2:
                        raise
                    continue
                if conn.usable and self.keep_alive:
                    self._idle.append(conn)
                else:
                    conn.close()
                return response
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
