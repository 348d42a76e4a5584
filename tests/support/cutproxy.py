"""A real TCP proxy in front of a server, that cuts chosen requests: mid-request, or
after the request with part of (or none of) the answer. A rule is armed once; the first
connection whose client bytes hold its marker (a request line) is cut as it says."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CHUNK_BYTES = 16384


@dataclass
class Cut:
    """Cut the connection whose request holds ``marker``: after ``request_bytes`` of the
    request went on (None: all of it), then after ``answer_bytes`` of the answer came back."""

    marker: bytes
    request_bytes: int | None = None
    answer_bytes: int = 0
    used: bool = False


class _Link:
    """One client connection and its upstream; either side's end, or a cut, ends both."""

    def __init__(self, client: socket.socket, upstream: socket.socket, proxy: CutProxy) -> None:
        self.client, self.upstream, self.proxy = client, upstream, proxy
        self.cut: Cut | None = None
        self.sent = self.answered = 0
        self.closed = threading.Event()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for s in (self.client, self.upstream):
            # A reset, not a polite end: what a dead peer or a cut network looks like.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            try:  # wakes the other pump's recv: a close alone leaves it blocked
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the peer has gone already
            s.close()

    def requests(self) -> None:
        try:
            while chunk := self.client.recv(CHUNK_BYTES):
                if self.cut is None:
                    self.cut = self.proxy.take(chunk)
                    if self.cut is not None:  # counted from this request on (keep-alive:
                        self.sent = self.answered = 0  # the last answer is all back)
                if self.cut is not None and self.cut.request_bytes is not None:
                    chunk = chunk[:max(0, self.cut.request_bytes - self.sent)]
                self.upstream.sendall(chunk)
                self.sent += len(chunk)
                if self.cut is not None and self.cut.request_bytes is not None \
                        and self.sent >= self.cut.request_bytes:
                    break
        except OSError:
            pass
        self.close()

    def answers(self) -> None:
        try:
            while chunk := self.upstream.recv(CHUNK_BYTES):
                if self.cut is not None:
                    chunk = chunk[:max(0, self.cut.answer_bytes - self.answered)]
                self.client.sendall(chunk)
                self.answered += len(chunk)
                if self.cut is not None and self.answered >= self.cut.answer_bytes:
                    break
        except OSError:
            pass
        self.close()


class CutProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.rules: list[Cut] = []
        self.lock = threading.Lock()

    def arm(self, cut: Cut) -> Cut:
        with self.lock:
            self.rules.append(cut)
        return cut

    def take(self, chunk: bytes) -> Cut | None:
        with self.lock:
            for rule in self.rules:
                if not rule.used and rule.marker in chunk:
                    rule.used = True
                    return rule
        return None

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            link = _Link(client, upstream, self)
            for pump in (link.requests, link.answers):
                threading.Thread(target=pump, daemon=True).start()


@contextmanager
def cut_proxy(upstream_port: int) -> Iterator[CutProxy]:
    proxy = CutProxy(upstream_port)
    threading.Thread(target=proxy.serve, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.listener.close()
