"""A webhook receiver on loopback for tests: a real HTTP server that records every
request it gets and answers as the test tells it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from carpool.stack.waiting import wait_until


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at_s: float  # time.time() when it arrived

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


#: How the receiver answers: (status, extra headers) for the n-th request (from 0).
Answer = Callable[[int, Received], tuple[int, dict[str, str]]]


def always(status: int) -> Answer:
    return lambda _n, _r: (status, {})


#: The default receiver: 200 to everything.
OK: Final = always(200)


class _Server(ThreadingHTTPServer):
    #: socketserver's default backlog (5) drops connects under a dispatcher's concurrency.
    request_queue_size = 1024


class Receiver:
    def __init__(self, answer: Answer = OK) -> None:
        self.answer = answer
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                if len(body) < n:  # the sender died mid-request (a killed dispatcher):
                    self.close_connection = True  # nothing was delivered, as any server
                    return  # would judge a body cut short
                got = Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                               body, time.time())
                with receiver.lock:
                    index = len(receiver.received)
                    receiver.received.append(got)
                status, headers = receiver.answer(index, got)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST  # noqa: N815 — a redirect target may be fetched with GET

            def log_message(self, *_args: object) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def all(self) -> list[Received]:
        with self.lock:
            return list(self.received)

    def ids(self) -> set[str]:
        return {r.webhook_id for r in self.all()}

    def wait_for_ids(self, ids: set[str], timeout_s: float) -> None:
        wait_until(lambda: ids <= self.ids(), timeout_s,
                   f"{len(ids)} webhook ids (have {len(self.ids() & ids)})")


@contextmanager
def receiver(answer: Answer = OK) -> Iterator[Receiver]:
    r = Receiver(answer)
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
