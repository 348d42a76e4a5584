"""Load shedding: a submit that already waited too long inside the web answers 503 at once.

When the web's own CPU is the bottleneck, requests wait before any route runs: in
the listening socket's accept queue, in a connection's receive buffer, and (under
gevent) as ready greenlets behind the ones already running. Admission by predicted
wait (carpool.admission) never sees that wait, so a flood is queued in the web
instead of refused. Here, in front of Flask, an admitting request (``admits_work``)
is answered ``503 overloaded`` with ``Retry-After`` when, measured against the bound,

- the event loop is late by over half the bound (``LagMonitor``: a greenlet per worker
  process that sleeps ``LAG_INTERVAL_S``, then yields behind the ready greenlets, and
  records how late it got through; a request let in waits about as long again at
  each of its later steps, so half the bound is left for the wait it already had), or
- a front proxy's ``X-Request-Start`` says the request started longer ago, or
- the kernel received the request's bytes longer ago (``queued``: TCP_INFO of the
  connection, web/common/backlog.py), or
- the accept queue holds more connections than the web serves in that time
  (``listen_backlog``: its length times the measured CPU per request, Little's law).

The answer is made before the body is read, JSON parsed or Redis asked, from bytes
prepared here: a shed costs a small part of a submit (docs/benchmarks.md). Reads,
DELETE, /healthz, /readyz and /metrics are never shed: they admit no work, and an
overloaded web must still say so.

Every admitting request refused (429 or 503, shed or not, before any of its jobs was
admitted) reports how long its caller waited at the web — from its bytes reaching this
host to the answer — to ``on_refused``: ``carpool_web_refusal_seconds``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask

from web.common.backlog import ListenBacklog, ServiceRate, data_age_ms

#: How often the lag monitor wakes: short enough to see a stall of the bound's
#: size, long enough that its own wake-ups cost nothing (tens of µs, 40 a second).
LAG_INTERVAL_S = 0.025
#: The remembered lag halves this often once the loop is on time again, so one
#: stall sheds the requests that waited it out and a few tenths of a second more
#: (one slow request must not shed the next second's), and a lasting overload (late
#: at every wake-up) sheds for as long as it lasts.
LAG_HALF_LIFE_S = 0.1
#: Retry-After of a shed: the lag that caused it decays within about a second.
RETRY_AFTER_S = 1
SHED_CODE = "overloaded"
#: Why a request was shed: the ``reason`` label of ``carpool_web_shed_total``.
REASON_LAG = "event_loop_lag"
REASON_REQUEST_START = "request_start"
REASON_QUEUED = "queued"
REASON_LISTEN_BACKLOG = "listen_backlog"
#: Refused as accepted: the wait ahead of it in its worker passes half the bound
#: (web/common/accept_shedding.py).
REASON_WAIT_AHEAD = "wait_ahead"
SHED_REASONS = (REASON_LAG, REASON_REQUEST_START, REASON_QUEUED, REASON_LISTEN_BACKLOG,
                REASON_WAIT_AHEAD)
#: The statuses of a refusal: the model's bound (429) or the web's, or a backend down (503).
REFUSALS = ("429", "503")
#: Set in a request's WSGI environ once its jobs are admitted (``metrics.jobs_admitted``):
#: what it answers after that (a 503 while it waits for results, say) refuses no job.
ADMITTED_ENVIRON = "carpool.admitted"
#: Exact paths that admit jobs; any POST under a versioned API prefix does too.
SHED_PATHS = frozenset({"/submit", "/submit/batch"})
SHED_PREFIXES = ("/v1/", "/v2/")
EXTENSION = "carpool.shedding"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def admits_work(method: str, path: str) -> bool:
    """True for the requests that may be shed: those that queue jobs."""
    return method == "POST" and (path in SHED_PATHS or path.startswith(SHED_PREFIXES))


def request_start_s(header: str | None) -> float | None:
    """Seconds since the epoch from ``X-Request-Start``, or None when absent or unreadable.

    Takes ``t=<value>`` (nginx: ``t=${msec}``) or a bare value, in seconds,
    milliseconds (Heroku) or microseconds, told apart by size as APM agents do:
    today is about 1.8e9 s, 1.8e12 ms, 1.8e15 µs.
    """
    if not header:
        return None
    raw = header.strip().removeprefix("t=")
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    if value > 1e14:
        return value / 1e6
    if value > 1e11:
        return value / 1e3
    return value


class LagMonitor:
    """How late this process's event loop is: a decayed peak of the monitor's lateness.

    ``run`` sleeps ``interval_s`` again and again; a wake-up ``x`` seconds after it
    was due means every ready greenlet waited about that long too. ``lag_s`` is the
    largest lateness seen, halved every ``half_life_s`` since, or the lateness of
    the sleep still under way if that is more: a request handled right after a
    stall sees it even when it runs before the monitor's own wake-up.
    """

    def __init__(self, interval_s: float = LAG_INTERVAL_S,
                 half_life_s: float = LAG_HALF_LIFE_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.interval_s = interval_s
        self.half_life_s = half_life_s
        self._clock = clock
        self._sleep = sleep
        self._peak_s = 0.0
        self._peak_at = clock()
        self._sleeping_since: float | None = None

    def woke(self, slept_at: float, now: float) -> None:
        """Record a wake-up at ``now`` from a sleep of ``interval_s`` begun at ``slept_at``."""
        late_s = max(0.0, now - slept_at - self.interval_s)
        self._peak_s = max(late_s, self._decayed(now))
        self._peak_at = now

    def lag_s(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        since = self._sleeping_since
        overdue_s = 0.0 if since is None else max(0.0, now - since - self.interval_s)
        return max(self._decayed(now), overdue_s)

    def _decayed(self, now: float) -> float:
        return float(self._peak_s * 0.5 ** (max(0.0, now - self._peak_at) / self.half_life_s))

    def step(self) -> None:
        """One sleep and its wake-up."""
        # time.sleep looked up here, not bound at import: gunicorn imports web modules
        # before gevent patches time.sleep, and an unpatched sleep would stop the loop.
        sleep = self._sleep or time.sleep
        slept_at = self._clock()
        self._sleeping_since = slept_at
        sleep(self.interval_s)
        # A timer's wake-up comes before the loop's queue of ready greenlets (new
        # connections' handlers, wake-ups by events) is run: yielding once more waits
        # behind that queue, as every such greenlet does.
        sleep(0)
        self.woke(slept_at, self._clock())

    def run(self) -> None:
        while True:
            self.step()

    def start(self) -> None:
        """Run in the background: under gevent's patched threading, a greenlet."""
        threading.Thread(target=self.run, name="carpool-lag-monitor", daemon=True).start()


def _shed_body(max_queue_ms: int) -> bytes:
    message = (f"the web is overloaded: requests wait over {max_queue_ms} ms before they "
               f"are handled, so nothing was queued; retry after {RETRY_AFTER_S} s")
    return json.dumps({"error": {"code": SHED_CODE, "message": message,
                                 "type": "server_error", "param": None}}).encode()


class Shedder:
    """WSGI middleware in front of the Flask app: sheds admitting requests that waited,
    and times every refusal of an admitting request."""

    def __init__(self, app: WsgiApp, max_queue_ms: int, monitor: LagMonitor,
                 on_shed: Callable[[str], None],
                 on_refused: Callable[[float], None] = lambda waited_s: None,
                 wall_clock: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.max_queue_s = max_queue_ms / 1000.0
        self.monitor = monitor
        self.on_shed = on_shed
        self.on_refused = on_refused
        self._wall_clock = wall_clock
        self._clock = clock
        #: This process's CPU per request: how fast it drains the accept queue.
        self.rate = ServiceRate()
        #: The listening sockets, once a gunicorn worker has them (``watch_listeners``).
        self.backlog: ListenBacklog | None = None
        #: Run as each request starts, before it is judged: the accept loop's drain
        #: (web/common/accept_shedding.py).
        self.before_request: list[Callable[[], None]] = []
        #: The shed answer's body and headers (but the status line's).
        self.body = _shed_body(max_queue_ms)
        self.headers = [("Content-Type", "application/json"),
                        ("Content-Length", str(len(self.body))),
                        ("Retry-After", str(RETRY_AFTER_S))]

    def reason(self, environ: dict[str, Any]) -> str | None:
        """Why this request is to be shed, or None to serve it."""
        if not admits_work(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")):
            return None
        return self._judge(environ.get("gunicorn.socket"), environ.get("HTTP_X_REQUEST_START"),
                           self._clock())[0]

    def overloaded(self) -> bool:
        """True while requests wait over the bound: the loop is late, or the accept
        queue holds more than the web serves within it."""
        bound_s = self.max_queue_s
        if bound_s <= 0:
            return False
        return self.monitor.lag_s() > bound_s or (
            self.backlog is not None and self.backlog.wait_s() > bound_s)

    def under_pressure(self, sock: Any) -> bool:
        """True when a request on ``sock`` (a connection just accepted) may be shed
        before gunicorn parses it: the web is ``overloaded``, or its bytes waited over
        the bound. A proxy's stamp alone is left to the judge in front of Flask."""
        if self.overloaded():
            return True
        age_ms = data_age_ms(sock)
        return age_ms is not None and age_ms > self.max_queue_s * 1000.0 > 0

    def judge_socket(self, sock: Any) -> tuple[str | None, float]:
        """``_judge`` of a request on ``sock`` (a connection just accepted) before
        gunicorn parses it, so without a proxy's ``X-Request-Start``."""
        return self._judge(sock, None, self._clock())

    def shed(self, why: str, waited_s: float) -> None:
        """Count a request shed for ``why``, refused after ``waited_s`` at the web."""
        self.on_shed(why)
        self.on_refused(waited_s)

    def _judge(self, sock: Any, request_start: str | None, now: float
               ) -> tuple[str | None, float]:
        """(why it is shed or None, how long it waited before it was handled)."""
        lag_s = self.monitor.lag_s(now)
        age_ms = data_age_ms(sock)
        # The kernel's age of the request's bytes is its whole wait in this host; where
        # there is none (not TCP), the loop's lag is the best guess.
        waited_s = lag_s if age_ms is None else age_ms / 1000.0
        bound_s = self.max_queue_s
        if bound_s <= 0:
            return None, waited_s
        if lag_s > bound_s / 2:
            return REASON_LAG, waited_s
        started = request_start_s(request_start)
        if started is not None and self._wall_clock() - started > bound_s:
            return REASON_REQUEST_START, waited_s
        if age_ms is not None and age_ms > bound_s * 1000.0:
            return REASON_QUEUED, waited_s
        if self.backlog is not None and self.backlog.wait_s() > bound_s:
            return REASON_LISTEN_BACKLOG, waited_s
        return None, waited_s

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        self.rate.tick()
        for hook in self.before_request:
            hook()
        if not admits_work(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")):
            return self.app(environ, start_response)
        began = self._clock()
        why, waited_s = self._judge(environ.get("gunicorn.socket"),
                                    environ.get("HTTP_X_REQUEST_START"), began)
        if why is not None:
            self.shed(why, waited_s + self._clock() - began)
            start_response("503 Service Unavailable", list(self.headers))
            return [self.body]

        def answer(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            if status.startswith(REFUSALS) and not environ.get(ADMITTED_ENVIRON):
                self.on_refused(waited_s + self._clock() - began)
            return start_response(status, headers, exc_info)

        return self.app(environ, answer)


def install(app: Flask, max_queue_ms: int, on_shed: Callable[[str], None],
            on_refused: Callable[[float], None]) -> Shedder:
    """Put a ``Shedder`` in front of ``app``; its lag monitor waits for ``start_lag_monitor``."""
    shedder = Shedder(app.wsgi_app, max_queue_ms, LagMonitor(), on_shed, on_refused)
    app.wsgi_app = shedder  # type: ignore[method-assign]  # Flask's way to add middleware
    app.extensions[EXTENSION] = shedder
    return shedder


def start_lag_monitor(app: Flask, listeners: Iterable[Any] = (), processes: int = 1) -> None:
    """Start ``app``'s lag monitor and watch ``listeners``' accept queue (shared by
    ``processes`` workers), in a gunicorn worker once gevent has patched.

    Not in ``create_app``: the Flask test client and tools build apps that serve no
    event loop, and the master process serves none either.
    """
    shedder = app.extensions.get(EXTENSION)
    if isinstance(shedder, Shedder) and shedder.max_queue_s > 0:
        # gunicorn wraps each listening socket; the kernel's is its ``sock``.
        socks = [getattr(listener, "sock", listener) for listener in listeners]
        if socks:
            shedder.backlog = ListenBacklog(socks, processes, shedder.rate)
        shedder.monitor.start()
