"""Shedding at accept: under overload, a submit is refused as its connection is accepted.

A shed in front of Flask (web/common/shedding.py) still costs its request gunicorn's
part: a greenlet, the HTTP parse, the WSGI environ and the answer's writing, most of
a request's floor (docs/benchmarks.md). When the web's CPU is what is short, those
requests also wait for it in the listening socket's accept queue, where gunicorn's
gevent worker takes one connection per loop turn: refusals came seconds late, as late
as the answers they spared.

Here, in the worker's accept loop (``AcceptShedding.accepted``, on the event loop's
own greenlet, before any greenlet is spawned): while the web is overloaded — its
event loop late, or its accept queue holding more than it serves within the bound —
the loop takes up to ``ACCEPT_BURST`` connections a turn. A connection accepted then,
or one whose bytes waited over the bound, is read without taking its bytes
(``MSG_PEEK``); when they are one whole request that admits work and the judge sheds
it (``Shedder.judge_socket``: the same reasons, but a proxy's stamp), it gets the same
503 ``overloaded`` answer, written straight to the socket, which is then closed.
Anything else — another request, one not wholly arrived, pipelined, chunked, TLS, a
PROXY header, a calm web — goes on to gunicorn as before, to be judged again there.

The request's bytes are read out of the socket before the answer is written, so the
kernel closes it with a FIN, not a reset that could lose the answer.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from web.common.shedding import Shedder, admits_work

#: Connections taken per loop turn while overloaded (gunicorn's gevent worker takes
#: one per turn, so that several workers share the accept queue evenly).
ACCEPT_BURST = 64
#: The most bytes looked at: a request whose head and body are not all within
#: this goes on to gunicorn.
PEEK_BYTES = 16384


@dataclass(frozen=True)
class PeekedRequest:
    """What the accept loop reads of a request still in the kernel's buffer."""

    method: str
    path: str
    #: Its bytes, head and body: what is read out of the socket before answering.
    length: int


def whole_request(data: bytes) -> PeekedRequest | None:
    """The request ``data`` starts with, when it is a whole HTTP/1.x request with a
    Content-Length body (or none); None for anything else."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = data[:head_end]
    line, _, fields = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    length, seen_length = 0, False
    for field in fields.split(b"\r\n"):
        name, colon, value = field.partition(b":")
        if not colon:
            return None
        name = name.lower()
        if name == b"transfer-encoding":
            return None  # chunked: gunicorn's to read
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or seen_length:
                return None  # gunicorn's to refuse: a bad length, or two
            length, seen_length = int(value), True
    total = head_end + 4 + length
    if total > len(data):
        return None
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    return PeekedRequest(method, target.partition("?")[0], total)


class AcceptShedding:
    """The accept loop's side of shedding, for one gunicorn worker."""

    def __init__(self, shedder: Shedder) -> None:
        self.shedder = shedder
        status = b"HTTP/1.1 503 Service Unavailable\r\n"
        fields = b"".join(f"{name}: {value}\r\n".encode() for name, value in shedder.headers)
        self.answer = status + fields + b"Connection: close\r\n\r\n" + shedder.body

    def connections_per_turn(self) -> int:
        return ACCEPT_BURST if self.shedder.overloaded() else 1

    def accepted(self, client: Any) -> bool:
        """True when ``client`` (a gevent socket just accepted) was answered and closed."""
        raw = getattr(client, "_sock", client)  # the kernel's socket, non-blocking
        if not self.shedder.under_pressure(raw):  # no read, no parse: the common case
            return False
        try:
            data = raw.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:  # nothing arrived yet, or the peer is gone: gunicorn's to see
            return False
        found = whole_request(data)
        # One whole request and nothing after it (a pipelined second request would be
        # left unread, and the close would reset the connection, answer and all).
        if found is None or found.length != len(data) or not admits_work(found.method,
                                                                            found.path):
            return False
        why, waited_s = self.shedder.judge_socket(raw)
        if why is None:
            return False
        try:
            raw.recv(found.length, socket.MSG_DONTWAIT)  # taken out: a FIN on close, not a reset
            raw.send(self.answer, socket.MSG_DONTWAIT)
        except OSError:
            pass  # the caller left: nothing to answer
        client.close()
        self.shedder.rate.tick()  # a request taken from the accept queue, and answered
        self.shedder.shed(why, waited_s)
        return True


def accept_shedding_server(base: type, shedding: Callable[[], AcceptShedding | None]
                           ) -> type:
    """A subclass of gevent's ``StreamServer`` (``base``) whose accept loop sheds."""

    class SheddingServer(base):  # type: ignore[misc]
        @property
        def max_accept(self) -> int:
            found = shedding()
            return 1 if found is None else found.connections_per_turn()

        @max_accept.setter
        def max_accept(self, _value: int) -> None:
            pass  # gunicorn sets 1 with several workers: the property decides

        def do_handle(self, *args: Any) -> None:
            found = shedding()
            if found is not None and found.accepted(args[0]):
                return
            super().do_handle(*args)

    return SheddingServer


def install_in_worker(app: Any) -> bool:
    """Make this gunicorn gevent worker's accept loop shed for ``app``'s shedder; False
    (nothing changed) when shedding is off. Call before the worker starts serving.

    gunicorn's gevent worker builds its ``StreamServer`` from its module's global when
    it starts serving; that name is replaced in this worker process only.
    """
    from gunicorn.workers import ggevent

    from web.common.shedding import EXTENSION

    shedder = app.extensions.get(EXTENSION)
    if not isinstance(shedder, Shedder) or shedder.max_queue_s <= 0:
        return False
    shedding = AcceptShedding(shedder)
    ggevent.StreamServer = accept_shedding_server(ggevent.StreamServer, lambda: shedding)
    return True
