"""A real TCP proxy that can be switched off and on: while off, every connection is
reset, open ones too (a server down, or a cut network), and the server behind it
keeps its state (moto's S3 lives in its process's memory)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

CHUNK_BYTES = 65536


def _close(sock: socket.socket, reset: bool) -> None:
    if reset:  # SO_LINGER 0: the close sends a reset, as a dead peer's network does
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:  # wakes the other pump's recv: a close alone leaves it blocked
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # gone already
    sock.close()


class Switch:
    """Forwards 127.0.0.1:``port`` to ``upstream_port`` while on."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.on = True
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()

    def off(self) -> None:
        with self.lock:
            self.on = False
            links, self.open = self.open, set()
        for sock in links:
            _close(sock, reset=True)

    def turn_on(self) -> None:
        with self.lock:
            self.on = True

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                if not self.on:
                    _close(client, reset=True)
                    continue
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
                self.open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(CHUNK_BYTES):
                sink.sendall(chunk)
        except OSError:
            pass
        with self.lock:
            gone = {source, sink} & self.open
            self.open -= gone
        for sock in gone:  # one side ended: so does the other, politely
            _close(sock, reset=False)


@contextmanager
def switch(upstream_port: int) -> Iterator[Switch]:
    proxy = Switch(upstream_port)
    threading.Thread(target=proxy.serve, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.listener.close()
