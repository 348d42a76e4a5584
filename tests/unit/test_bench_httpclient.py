"""The bench's HTTP client against a real loopback server: kept-alive connections
reused, or (``keep_alive=False``) a new connection per request, closed after it."""

from __future__ import annotations

import asyncio

import pytest

from carpool.bench.httpclient import HttpClient


class Server:
    """Answers every request 200 with its own number; closes when asked to."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = 0
        self.heads: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                self.heads.append(head)
                body = str(len(self.heads)).encode()
                close = b"connection: close" in head.lower()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s"
                             % (len(body), b"Connection: close\r\n" if close else b"", body))
                await writer.drain()
                if close:
                    break
        except asyncio.IncompleteReadError:
            pass  # the client hung up between requests
        finally:
            writer.close()
            await writer.wait_closed()
            self.closed += 1

    async def all_closed(self) -> None:
        while self.closed < self.connections:
            await asyncio.sleep(0.01)


async def three_requests(keep_alive: bool) -> tuple[Server, list[bytes]]:
    server = Server()
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    client = HttpClient(f"http://127.0.0.1:{port}", keep_alive=keep_alive)
    try:
        bodies = [(await client.request("GET", "/healthz")).body for _ in range(3)]
    finally:
        client.close()
        await asyncio.wait_for(server.all_closed(), 5)
        listening.close()
        await listening.wait_closed()
    return server, bodies


@pytest.mark.parametrize(("keep_alive", "connections"), [(True, 1), (False, 3)])
def test_connections_are_reused_only_when_kept_alive(keep_alive: bool,
                                                     connections: int) -> None:
    server, bodies = asyncio.run(three_requests(keep_alive))
    assert bodies == [b"1", b"2", b"3"]
    assert server.connections == connections
    asks_close = [b"\r\nConnection: close\r\n" in head for head in server.heads]
    assert asks_close == [not keep_alive] * 3
