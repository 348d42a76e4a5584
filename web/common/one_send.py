"""A small response in one send: gunicorn writes a response's head and body in two.

gunicorn's ``Response.write`` sends the status line and headers, then the body part:
two ``send`` calls, each a TCP segment the kernel carries to the reader at once (the
socket has Nagle's delay off). In a py-spy profile of a loaded web worker answering
``POST /submit?wait``, ``send`` was the largest single cost, a fifth of the worker's
time, two thirds of it the response's two (docs/benchmarks.md).

``OneSendResponse`` gathers the head and a first body part of up to
``GATHER_MAX_BYTES`` and sends them in one call, with gunicorn's own bookkeeping
(its headers, a body omitted for HEAD or 204, a body cut at its Content-Length,
a chunk's framing): the bytes on the wire are the same, in fewer segments. A larger
first part, and every part after the first, goes as gunicorn sends it.
"""

from __future__ import annotations

from typing import Any

from gunicorn.http import wsgi

#: The most body bytes gathered with the head: a small copy, against a send saved;
#: a larger body is not copied, and its head goes alone.
GATHER_MAX_BYTES = 64 * 1024


class _Gathered:
    """Stands in for the socket while gunicorn writes the head and a first part."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.parts.append(data)


class OneSendResponse(wsgi.Response):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's response, whose head goes out with the first body part."""

    #: Set on the class, so that installing twice is seen.
    one_send = True
    #: gunicorn's client socket; ``_Gathered`` while a head is gathered.
    sock: Any

    def write(self, arg: bytes) -> None:
        if self.headers_sent or not isinstance(arg, bytes) or len(arg) > GATHER_MAX_BYTES:
            super().write(arg)
            return
        sock, gathered = self.sock, _Gathered()
        self.sock = gathered
        try:
            super().write(arg)
        finally:
            # What gunicorn would have sent by now is sent, even when it raised.
            self.sock = sock
            if gathered.parts:
                sock.sendall(b"".join(gathered.parts))


def install() -> bool:
    """Make this process's gunicorn HTTP/1 responses ``OneSendResponse``; False when
    done already. Call in a worker before it serves (post_worker_init).

    gunicorn's ``wsgi.create`` takes the response class from its module's global when
    none is given (HTTP/2 passes its own); that name is replaced in this worker
    process only, so the master and other processes keep gunicorn's.
    """
    if getattr(wsgi.Response, "one_send", False):
        return False
    wsgi.Response = OneSendResponse
    return True
