"""Shedding between requests: under overload, the next submit on a kept-alive connection
is refused before gunicorn parses it.

Accept-time shedding (web/common/accept_shedding.py) refuses a new connection's first
request for a small part of a request's cost. A client that keeps its connection
alive — every HTTP library's pool does — sends its next requests on a connection
gunicorn already serves: each is parsed, made a WSGI environ, judged in front of Flask
and answered through gunicorn's response, the whole floor of a request
(docs/benchmarks.md). Under a flood those refusals take the CPU that admitted jobs
need.

Here gunicorn's request parser (``SheddingParser``) does on a kept-alive connection
what the accept loop does: once a request is answered, while the web is under pressure
(``AcceptShedding.pressed``, read at most once per PRESSED_TTL_S), it waits for the
next request's bytes, looks at them without taking them (``MSG_PEEK``) and, when they
are one whole request that admits work and the judge sheds it, reads them out and
answers the same 503 ``overloaded`` straight to the socket. The connection stays open
for the next request, judged the same way, with a whole keep-alive timeout again
(``KeepAliveTimeouts``), as a parsed shed leaves it: a client that reconnected after
each refusal would queue its handshakes in the accept queue. It is closed when the
client asked for that (``Connection: close``, HTTP/1.0 without keep-alive) or its
worker is stopping. Anything
else — bytes gunicorn has already read ahead, a request not wholly arrived, pipelined
or chunked, a calm web — goes on to gunicorn as before.

The wait for the next request is gunicorn's own: under its keep-alive timeout
(``gevent.Timeout``, which ends the connection when it passes, as it would in
gunicorn's read). TLS connections keep gunicorn's parser: their bytes cannot be peeked.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

import gevent
from gunicorn import http
from gunicorn.http.parser import RequestParser

#: How long one reading of the web's pressure serves the connections that ask: under
#: load requests end many times a millisecond, and a reading costs a system call.
PRESSED_TTL_S = 0.005
#: What became of a kept-alive connection's request refused here.
KEPT_OPEN = "kept open"
CLOSED = "closed"


class Shedding(Protocol):
    """What shedding before gunicorn offers (``AcceptShedding``,
    web/common/accept_shedding.py, which installs this module)."""

    def pressed(self) -> bool: ...

    def verdict(self, client: Any, accepted: bool = True) -> Any: ...

    def refuse(self, client: Any, verdict: Any, keep_open: bool = False) -> bool: ...

    def failed(self, doing: str) -> None: ...


class PressureReading:
    """``AcceptShedding.pressed``, read again at most once per ``ttl_s``."""

    def __init__(self, shedding: Shedding, ttl_s: float = PRESSED_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.shedding = shedding
        self.ttl_s = ttl_s
        self._clock = clock
        self._read_at = -float("inf")
        self._pressed = False

    def pressed(self) -> bool:
        now = self._clock()
        if now - self._read_at >= self.ttl_s:
            self._pressed = self.shedding.pressed()
            self._read_at = now
        return self._pressed


class KeepAliveTimeouts:
    """The gevent worker's keep-alive timeouts (its ``timeout_ctx``: a ``gevent.Timeout``
    around each wait for a connection's next request), kept by greenlet, so that a
    refusal here restarts its connection's as an answer through gunicorn would."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running: dict[Any, _Running] = {}

    def timeout_ctx(self) -> _Running:
        return _Running(self)

    def restart(self) -> None:
        """Give the current greenlet's connection a whole keep-alive timeout again."""
        running = self.running.get(gevent.getcurrent())
        if running is not None:
            running.restart()


class _Running:
    """One wait for a request under the keep-alive timeout, as gunicorn's own
    ``gevent.Timeout(keepalive, False)``: its expiry ends the wait silently."""

    __slots__ = ("_greenlet", "_timeout", "_timeouts")

    def __init__(self, timeouts: KeepAliveTimeouts) -> None:
        self._timeouts = timeouts

    def __enter__(self) -> _Running:
        self._greenlet = gevent.getcurrent()
        self._timeout = gevent.Timeout(self._timeouts.seconds, False)
        self._timeout.start()
        self._timeouts.running[self._greenlet] = self
        return self

    def restart(self) -> None:
        # A new timer: libev keeps a stopped timer's remaining time, so a stopped and
        # started one would expire when the first would have.
        self._timeout.close()
        self._timeout = gevent.Timeout(self._timeouts.seconds, False)
        self._timeout.start()

    def __exit__(self, typ: Any, value: Any, tb: Any) -> bool:
        self._timeouts.running.pop(self._greenlet, None)
        self._timeout.close()
        return value is self._timeout  # its own expiry, silent; anything else goes on


class SheddingParser(RequestParser):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's HTTP/1 request parser, which sheds the next requests of a kept-alive
    connection under pressure (the module's text); ``reading`` is set on the subclass
    made for one worker (``parser_class``)."""

    reading: PressureReading
    #: The worker's keep-alive timeouts (None: no timeout to restart).
    timeouts: KeepAliveTimeouts | None = None

    @staticmethod
    def keep_open() -> bool:
        """Whether a connection may stay open after a refusal: while its worker is alive."""
        return True

    def __next__(self) -> Any:
        if self.mesg is not None:
            while (refused := self._shed_next()) == KEPT_OPEN:
                if self.timeouts is not None:
                    self.timeouts.restart()  # a whole keep-alive wait for the next request
            if refused == CLOSED:
                # gunicorn's keep-alive loop ends on it, and closes the socket (again).
                raise StopIteration("a request on a kept-alive connection was shed")
        return super().__next__()

    next = __next__

    def _shed_next(self) -> str:
        """Whether the connection's next request was refused: KEPT_OPEN, CLOSED, or
        "" (left to gunicorn). Never raises but the keep-alive timeout."""
        shedding = self.reading.shedding
        try:
            if not self.reading.pressed():
                return ""  # the common case: gunicorn's __next__ alone
        except Exception:  # noqa: BLE001 — judged again in front of Flask
            shedding.failed("checking pressure on a kept-alive connection")
            return ""
        # As gunicorn's __next__ would (raising as it would): a connection to close ends
        # here, and the answered request's unread body is read out before the next one
        # is looked at.
        if self.mesg.should_close() or not self.finish_body() or _buffered(self.unreader):
            return ""
        sock = self.unreader.sock
        try:
            # Waits, cooperatively, for the next request's first bytes: gunicorn's
            # keep-alive timeout (a BaseException) ends the wait and the connection.
            if not sock.recv(1, socket.MSG_PEEK):
                return ""  # the client closed: gunicorn's read sees it
        except OSError:
            return ""
        try:
            verdict = shedding.verdict(sock, accepted=False)
        except Exception:  # noqa: BLE001 — judged again in front of Flask
            shedding.failed("shedding on a kept-alive connection")
            return ""
        if verdict is None:
            return ""
        # A worker shutting down closes each connection after its next answer, as
        # gunicorn does (``force_close``).
        kept = shedding.refuse(sock, verdict, keep_open=self.keep_open())
        return KEPT_OPEN if kept else CLOSED


def _buffered(unreader: Any) -> bool:
    """True when gunicorn has read bytes of the next request ahead (pipelined): the
    kernel's buffer no longer starts at a request."""
    with unreader.buf.getbuffer() as held:
        return bool(held.nbytes)


def parser_class(shedding: Shedding, timeouts: KeepAliveTimeouts | None = None,
                 worker: Any = None) -> type[SheddingParser]:
    """A ``SheddingParser`` for one worker's ``shedding`` and keep-alive ``timeouts``,
    keeping connections open while the gunicorn ``worker`` is alive."""
    attributes: dict[str, Any] = {"reading": PressureReading(shedding), "timeouts": timeouts}
    if worker is not None:
        attributes["keep_open"] = staticmethod(lambda: bool(worker.alive))
    return type("WorkerSheddingParser", (SheddingParser,), attributes)


def install(shedding: Shedding, worker: Any) -> bool:
    """Have gunicorn parse this gevent ``worker`` process's plain HTTP/1 connections
    with a ``SheddingParser``, and time their keep-alive waits with restartable
    timeouts; False (nothing changed) where this gunicorn has no ``http.get_parser``
    to build them (older ones name ``RequestParser`` in their workers) or it is done
    already."""
    make = getattr(http, "get_parser", None)
    if make is None or getattr(make, "sheds_kept_alive", False):
        return False
    timeouts = KeepAliveTimeouts(worker.cfg.keepalive)
    worker.timeout_ctx = timeouts.timeout_ctx  # gunicorn's async worker asks its own
    parser = parser_class(shedding, timeouts, worker)

    def get_parser(cfg: Any, source: Any, source_addr: Any, *args: Any, **kwargs: Any
                   ) -> Any:
        made = make(cfg, source, source_addr, *args, **kwargs)
        # Only gunicorn's plain HTTP/1 parser of a socket (not HTTP/2, uWSGI or TLS).
        if type(made) is not RequestParser or getattr(cfg, "is_ssl", False) or not hasattr(
                source, "recv"):
            return made
        return parser(cfg, source, source_addr)

    get_parser.sheds_kept_alive = True  # type: ignore[attr-defined]
    http.get_parser = get_parser
    return True
