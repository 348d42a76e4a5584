"""A real HTTP server on loopback that answers from a script, for the client's tests:
each request (method, path, headers) is recorded, and the script gives the n-th one's
answer. It can be made to bind its port before it listens, so a client first finds
nothing answering there (a refused connection), then the server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Asked:
    method: str
    path: str
    headers: dict[str, str]
    at_s: float  # time.monotonic() when it arrived


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def json_error(status: int, code: str, retry_after_s: int | None = None) -> Answer:
    """carpool's error body, with Retry-After when given."""
    headers = {"Content-Type": "application/json"}
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return Answer(status, f'{{"error": {{"code": "{code}", "message": "m"}}}}'.encode(),
                  headers)


#: The answer to the n-th request (from 0).
Script = Callable[[int, Asked], Answer]


class ScriptedServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.asked: list[Asked] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 — http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                asked = Asked(self.command, self.path, {k.lower(): v for k, v
                                                        in self.headers.items()},
                              time.monotonic())
                with server.lock:
                    index = len(server.asked)
                    server.asked.append(asked)
                answer = server.script(index, asked)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            do_POST = do_GET  # noqa: N815

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler,
                                          bind_and_activate=False)
        self.server.daemon_threads = True
        self.server.server_bind()  # the port is ours; connects are refused until listen()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: shutdown() waits for it, at the end of every test.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True)

    def listen(self) -> None:
        self.server.server_activate()
        self.thread.start()

    def requests(self) -> list[Asked]:
        with self.lock:
            return list(self.asked)


@contextmanager
def scripted(script: Script, *, listening: bool = True) -> Iterator[ScriptedServer]:
    s = ScriptedServer(script)
    if listening:
        s.listen()
    try:
        yield s
    finally:
        if s.thread.is_alive():
            s.server.shutdown()
        s.server.server_close()
