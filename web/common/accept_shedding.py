"""Shedding at accept: under overload, a submit is refused as its connection is accepted.

A shed in front of Flask (web/common/shedding.py) still costs its request gunicorn's
part: a greenlet, the HTTP parse, the WSGI environ and the answer's writing, most of
a request's floor (docs/benchmarks.md). When the web's CPU is what is short, those
requests also wait for it in the listening socket's accept queue, where gunicorn's
gevent worker takes one connection per loop turn: refusals came seconds late, as late
as the answers they spared.

Here, in the worker's accept loop (``SheddingServer``, on the event loop's own
greenlet, before any greenlet is spawned), and as each request starts (``drain``:
under load the loop's turns come too seldom for a prompt refusal), while the web is
under pressure (``AcceptShedding.pressed``) — the wait ahead of a connection handed
over now (the event loop's lag, or connections handed over and not yet started)
passing half the bound, or the accept queue holding more than the web serves within
it — the worker takes the connections waiting to be accepted. Each is read without
taking its bytes (``MSG_PEEK``); when they are one whole request that admits work and
the judge sheds it (``Shedder.judge_socket``: the same reasons, but a proxy's stamp;
or ``wait_ahead``), it gets the same 503 ``overloaded`` answer, written straight to
the socket, which is then closed. Anything else — another request, one not wholly
arrived, pipelined, chunked, TLS, a PROXY header, a calm web — goes on to gunicorn as
before, to be judged again there. The listening socket defers accept
(``defer_accept``): a connection is queued once its first bytes arrive, so it is
judged by its request, not handed over unread.

The request's bytes are read out of the socket before the answer is written, so the
kernel closes it with a FIN, not a reset that could lose the answer.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gevent.server import StreamServer

from web.common import keepalive_shedding
from web.common.backlog import MIN_LISTEN_QUEUE, listen_queue
from web.common.peeked import whole_request
from web.common.shedding import EXTENSION, REASON_WAIT_AHEAD, Shedder, admits_work

log = logging.getLogger(__name__)

#: Connections taken per loop turn while overloaded (gunicorn's gevent worker takes
#: one per turn, so that several workers share the accept queue evenly).
ACCEPT_BURST = 64
#: A lasting failure is logged once per this many.
FAILURE_LOG_EVERY = 1000
#: The most bytes looked at: a request whose head and body are not all within
#: this goes on to gunicorn.
PEEK_BYTES = 16384
#: How long the kernel holds a connection that has sent nothing before it queues it
#: for accept all the same (``defer_accept``).
DEFER_ACCEPT_S = 1
#: Each measured interval between handlers' starts weighs this much in the mean ...
START_WEIGHT = 0.1
#: ... counts at most this much (a stall is the lag monitor's to see) ...
MAX_START_INTERVAL_S = 0.02
#: ... and the mean halves this often while no start is measured.
START_HALF_LIFE_S = 1.0
#: A connection handed over this long ago and never started (its handler killed by a
#: stop) no longer counts as ahead of the next.
FORGET_UNSTARTED_S = 30.0


class AcceptShedding:
    """The accept loop's side of shedding, for one gunicorn worker."""

    def __init__(self, shedder: Shedder, clock: Callable[[], float] = time.monotonic) -> None:
        self.shedder = shedder
        self._clock = clock
        status = b"HTTP/1.1 503 Service Unavailable\r\n"
        fields = b"".join(f"{name}: {value}\r\n".encode() for name, value in shedder.headers)
        self.answer = status + fields + b"Connection: close\r\n\r\n" + shedder.body
        #: The answer on a connection kept open (web/common/keepalive_shedding.py).
        self.kept_answer = status + fields + b"Connection: keep-alive\r\n\r\n" + shedder.body
        self._failures = 0
        #: When each connection handed to gunicorn was spawned, oldest first, until its
        #: handler starts (gevent starts spawned greenlets in order).
        self.spawned_at: dict[int, float] = {}
        self._last_began = 0.0
        #: How long apart handlers start while others wait for theirs (a running mean,
        #: measured at ``_paced_at``).
        self._start_interval_s = 0.0
        self._paced_at = 0.0

    def spawned(self, client: Any) -> None:
        """``client`` was handed to gunicorn: its handler will start behind the rest."""
        self.spawned_at[id(client)] = self._clock()

    def forget(self, client: Any) -> None:
        """``client``'s handler will never start (its spawn failed)."""
        self.spawned_at.pop(id(client), None)

    def began(self, client: Any) -> None:
        """A handed-over connection's handler has started: time the starts while
        connections wait for theirs (gevent starts a few greenlets per loop turn)."""
        spawned_at = self.spawned_at.pop(id(client), None)
        if spawned_at is None:
            return
        now = self._clock()
        if spawned_at < self._last_began:  # it waited while the one before it started
            # One long gap (a GC pause, a big body parsed) is capped: the lag monitor
            # sees stalls; this is the pace of a queue of starts.
            interval_s = min(now - self._last_began, MAX_START_INTERVAL_S)
            pace_s = self._pace_s(now)
            self._start_interval_s = pace_s + START_WEIGHT * (interval_s - pace_s)
            self._paced_at = now
        self._last_began = now

    def _pace_s(self, now: float) -> float:
        """The mean time between starts, halved every START_HALF_LIFE_S since it was
        last measured: a calm spell forgets a busy one."""
        age_s = max(0.0, now - self._paced_at)
        return float(self._start_interval_s * 0.5 ** (age_s / START_HALF_LIFE_S))

    def wait_ahead_s(self) -> float:
        """The wait ahead of a connection handed to gunicorn now: the event loop's lag,
        the oldest connection handed over and not started, or their number times the
        measured CPU per request or time between starts, whichever is most."""
        now = self._clock()
        spawned = self.spawned_at
        while spawned:  # one whose handler was killed unstarted (a stop) is let go
            oldest_s = now - next(iter(spawned.values()))
            if oldest_s <= FORGET_UNSTARTED_S:
                break
            del spawned[next(iter(spawned))]
        else:
            oldest_s = 0.0
        shedder = self.shedder
        each_s = max(shedder.rate.cpu_per_request_s(), self._pace_s(now))
        return max(shedder.monitor.lag_s(), oldest_s, len(spawned) * each_s)

    def ahead_passes(self, ahead_s: float) -> bool:
        """True when a wait ahead of ``ahead_s`` passes half the bound: a request let in
        now would not start within it (shedding on)."""
        return ahead_s > self.shedder.max_queue_s / 2 > 0

    def pressed(self) -> bool:
        """True while a connection accepted now is to be judged: the wait ahead of it
        ``ahead_passes``, or the web is ``overloaded``."""
        return self.ahead_passes(self.wait_ahead_s()) or self.shedder.overloaded()

    def failed(self, doing: str) -> None:
        """Log a failure of this code (the first, then one in FAILURE_LOG_EVERY: under
        overload a lasting fault would log at every connection)."""
        self._failures += 1
        if self._failures % FAILURE_LOG_EVERY == 1:
            log.exception("%s failed (%d times so far); the connection goes on as if "
                          "calm", doing, self._failures)

    def connections_per_turn(self, calm: int) -> int:
        """How many connections the accept loop takes this turn: ``calm`` (what gunicorn
        set: 1 with several workers, gevent's 100 with one), at least ACCEPT_BURST
        while overloaded."""
        return max(calm, ACCEPT_BURST) if self.pressed() else calm

    def verdict(self, client: Any, accepted: bool = True) -> Verdict | None:
        """Whether to refuse ``client`` (a gevent socket just accepted, or with
        ``accepted`` False one whose handler runs), and why; reads nothing out of it.
        The wait ahead counts for a connection just accepted only: a running handler
        waits behind no unstarted one."""
        raw = getattr(client, "_sock", client)  # the kernel's socket, non-blocking
        ahead_passes = accepted and self.ahead_passes(self.wait_ahead_s())
        if not (ahead_passes or self.shedder.under_pressure(raw)):
            return None  # no read, no parse: the common case
        try:
            data = raw.recv(PEEK_BYTES + 1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:  # nothing arrived yet, or the peer is gone: gunicorn's to see
            return None
        found = whole_request(data[:PEEK_BYTES])
        # One whole request and nothing after it (a pipelined second request, or more
        # than was looked at, would be left unread, and the close would reset the
        # connection, answer and all).
        if found is None or found.length != len(data) or not admits_work(found.method,
                                                                            found.path):
            return None
        why, waited_s = self.shedder.judge_socket(raw)
        if why is None and ahead_passes:
            why = REASON_WAIT_AHEAD
        return None if why is None else Verdict(why, waited_s, found.length, found.keep_alive)

    def refuse(self, client: Any, verdict: Verdict, keep_open: bool = False) -> bool:
        """Answer ``client`` 503 and count the shed; close it unless ``keep_open`` (and
        its client keeps it too). True when it is still open; never raises."""
        raw = getattr(client, "_sock", client)
        keep_open = keep_open and verdict.keep_alive
        try:
            # Out, so that a close sends a FIN, not a reset; and a connection kept open
            # must start at the next request.
            taken = raw.recv(verdict.length, socket.MSG_DONTWAIT)
            keep_open = keep_open and len(taken) == verdict.length
            sent = raw.send(self.kept_answer if keep_open else self.answer,
                            socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            # Kept open only when the whole answer went out at once (a few hundred
            # bytes: an empty send buffer takes them), else the client would read a
            # part of it and then the next answer.
            keep_open = keep_open and sent == len(self.kept_answer)
        except OSError:
            keep_open = False  # the caller left: nothing to answer
        finally:
            if not keep_open:
                client.close()
        try:
            self.shedder.rate.tick()  # a request taken from the accept queue, and answered
            self.shedder.shed(verdict.why, verdict.waited_s)
        except Exception:  # noqa: BLE001 — answered already; the count is what is lost
            self.failed("counting a shed before gunicorn")
        return keep_open


@dataclass(frozen=True)
class Verdict:
    """A request to refuse unparsed: why, how long it waited, its bytes, and whether its
    client keeps the connection open after an answer."""

    why: str
    waited_s: float
    length: int
    keep_alive: bool = False


def accept_shedding_server(base: type[StreamServer], shedding: AcceptShedding
                           ) -> type[StreamServer]:
    """A subclass of gevent's ``StreamServer`` (``base``) whose accept loop sheds.

    gevent's accept loop (``BaseServer._do_read``) reads ``max_accept`` once as a turn
    begins, then accepts (``do_read``) and hands over (``do_handle``) up to that many
    connections; ``do_read`` answering None ends the turn. A turn takes up to
    ACCEPT_BURST while overloaded, but hands no more connections to gunicorn than a
    calm turn would: the burst drains refusals, not work, into the process (work taken
    early would wait in gevent's run queue, where its age is no longer seen)."""

    class SheddingServer(base):  # type: ignore[misc]
        sheds_at_accept = True
        #: What gunicorn set (1 with several workers), else gevent's own.
        _calm_accept: int = base.max_accept
        #: Connections handed to gunicorn in this turn.
        _handed_over = 0
        _handle: Callable[..., Any]

        @property
        def max_accept(self) -> int:
            self._handed_over = 0  # read as each turn begins
            calm = self._calm_accept
            try:
                return shedding.connections_per_turn(calm)
            except Exception:  # noqa: BLE001 — raised in gevent's watcher, accepting would stop
                shedding.failed("judging overload at accept")
                return calm

        @max_accept.setter
        def max_accept(self, value: int) -> None:
            self._calm_accept = value

        def do_read(self) -> Any:
            if self._handed_over >= self._calm_accept:
                return None  # this turn's share of work is taken: the rest wait
            return super().do_read()

        def do_handle(self, *args: Any) -> None:
            try:
                verdict = shedding.verdict(args[0])
            except Exception:  # noqa: BLE001 — raised here, it would pause accepting
                shedding.failed("shedding at accept")
                verdict = None
            if verdict is not None:
                shedding.refuse(args[0], verdict)
                return
            self._handed_over += 1
            shedding.spawned(args[0])
            try:
                super().do_handle(*args)
            except BaseException:
                shedding.forget(args[0])
                raise

        def init_socket(self) -> None:
            super().init_socket()  # (re)sets _handle: gevent's own, or its TLS wrapper
            inner = self._handle

            def began(*args: Any) -> Any:
                shedding.began(args[0])
                return inner(*args)

            self._handle = began

        def start(self) -> None:
            super().start()
            shedding.shedder.before_request.append(self.drain)

        def close(self) -> None:
            if self.drain in shedding.shedder.before_request:
                shedding.shedder.before_request.remove(self.drain)
            super().close()

        def drain(self) -> None:
            """While pressed, or while connections pile up in the accept queue, take
            them (up to ACCEPT_BURST) as a turn does: refusing those to shed, handing
            over no more than a calm turn's share. Run as each request starts: under
            load the loop's own turns come too seldom for a refusal to be prompt.
            Never raises."""
            try:
                if self.closed or not (shedding.pressed() or piled_up(self.socket)):
                    return
                self._handed_over = 0
                for _ in range(ACCEPT_BURST):
                    if self.full():
                        return
                    args = self.do_read()  # None once this call's share is handed over
                    if not args:
                        return
                    self.do_handle(*args)
            except Exception:  # noqa: BLE001 — the request that ran it goes on
                shedding.failed("draining the accept queue")

    return SheddingServer


def piled_up(listener: Any) -> bool:
    """True when connections pile up in ``listener``'s accept queue (at least
    MIN_LISTEN_QUEUE): the loop's turns do not keep up. False where it cannot say."""
    found = listen_queue(getattr(listener, "_sock", listener))
    return found is not None and found[0] >= MIN_LISTEN_QUEUE


def install_in_worker(worker: Any) -> bool:
    """Make this gunicorn gevent worker's accept loop (and its kept-alive connections'
    parser: web/common/keepalive_shedding.py) shed for its app's shedder; False
    (nothing changed) when shedding is off, the worker is not gunicorn's gevent worker,
    or it is done already. Call before the worker starts serving (post_worker_init).

    gunicorn's gevent worker builds its ``StreamServer`` from its module's global when
    it starts serving; that name is replaced in this worker process only.
    """
    from gunicorn.workers import ggevent

    shedder = worker.wsgi.extensions.get(EXTENSION)
    if not isinstance(shedder, Shedder) or shedder.max_queue_s <= 0:
        return False
    # gevent_pywsgi (a server_class of its own) and other kinds never build it.
    if not isinstance(worker, ggevent.GeventWorker) or worker.server_class is not None:
        return False
    if getattr(ggevent.StreamServer, "sheds_at_accept", False):
        return False
    shedding = AcceptShedding(shedder)
    ggevent.StreamServer = accept_shedding_server(ggevent.StreamServer, shedding)
    keepalive_shedding.install(shedding, worker)  # and kept-alive connections' next
    for listener in worker.sockets:
        defer_accept(getattr(listener, "sock", listener))
    return True


def defer_accept(listener: Any) -> bool:
    """Have the kernel queue a TCP connection for accept once its first bytes arrive
    (``TCP_DEFER_ACCEPT``, as nginx's ``deferred``), or after DEFER_ACCEPT_S of
    silence; False where it cannot. A connection accepted under pressure can then be
    judged by its request at once, never handed over unread."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None or listener.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        listener.setsockopt(socket.IPPROTO_TCP, option, DEFER_ACCEPT_S)
    except OSError:
        return False
    return True
