"""What the kernel knows about the web's own backlog, without a proxy (Linux TCP_INFO).

A request waits before any route runs in two places the event-loop lag check does not
see: the listening socket's accept queue (gunicorn's gevent worker accepts one
connection per loop turn when there are several workers) and a connection's receive
buffer while its greenlet waits its turn. The kernel measures both:

- ``data_age_ms``: ``tcpi_last_data_recv`` of the connection, how long ago the kernel
  received its last bytes. Read as a request starts, that is how long the request
  has waited in this host: in the accept queue, the receive buffer and gevent's run
  queue together (a body still arriving makes it less, never more).
- ``listen_queue``: on a listening socket, ``tcpi_unacked`` is the accept queue's
  length and ``tcpi_sacked`` its limit. The wait ahead of a connection just queued is,
  by Little's law, that length over the rate the web takes requests (``RateMeter``,
  per process, times the processes sharing the socket).

Elsewhere (no ``TCP_INFO``, a Unix socket) both answer None and shed nothing.
"""

from __future__ import annotations

import math
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

#: struct tcp_info (linux/tcp.h): 8 one-byte fields, then 32-bit ones; these offsets
#: are stable ABI since Linux 2.6.
_TCP_INFO_BYTES = 104
_UNACKED_AT = 24
_SACKED_AT = 28
_LAST_DATA_RECV_AT = 52
_TCP_INFO = getattr(socket, "TCP_INFO", None)

#: The request rate is a count decayed with this half-life: long enough to average a
#: few hundred requests, short enough to follow the web's speed within a second.
RATE_HALF_LIFE_S = 0.5
#: Fewer queued connections than this never count as a backlog: right after an idle
#: spell the measured rate is near zero, and a handful of arrivals is no overload.
MIN_LISTEN_QUEUE = 8


def _tcp_info(sock: Any) -> bytes | None:
    if _TCP_INFO is None or sock is None:
        return None
    try:
        raw: bytes = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_BYTES)
    except (OSError, AttributeError, ValueError):  # not TCP, closed, or not a socket
        return None
    return raw if len(raw) >= _LAST_DATA_RECV_AT + 4 else None


def data_age_ms(sock: Any) -> int | None:
    """Milliseconds since the kernel last received bytes on ``sock``, or None."""
    raw = _tcp_info(sock)
    return None if raw is None else int(struct.unpack_from("<I", raw, _LAST_DATA_RECV_AT)[0])


def listen_queue(sock: Any) -> tuple[int, int] | None:
    """(connections waiting to be accepted, the queue's limit) of a listening socket."""
    raw = _tcp_info(sock)
    if raw is None:
        return None
    queued, limit = struct.unpack_from("<II", raw, _UNACKED_AT)
    return int(queued), int(limit)


class RateMeter:
    """Events per second, as a count decayed with ``half_life_s`` (an exponential window)."""

    def __init__(self, half_life_s: float = RATE_HALF_LIFE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._decay_per_s = math.log(2) / half_life_s
        self._clock = clock
        self._count = 0.0
        self._at = clock()

    def _decayed(self, now: float) -> float:
        return self._count * math.exp(-self._decay_per_s * max(0.0, now - self._at))

    def tick(self) -> None:
        now = self._clock()
        self._count = self._decayed(now) + 1.0
        self._at = now

    def per_s(self) -> float:
        # A count decayed at rate k holds about rate/k events in steady state.
        return self._decayed(self._clock()) * self._decay_per_s


class ListenBacklog:
    """The expected wait of a connection entering the accept queue(s) now, in seconds."""

    def __init__(self, listeners: Sequence[Any], processes: int, rate: RateMeter,
                 read: Callable[[Any], tuple[int, int] | None] = listen_queue) -> None:
        self.listeners = list(listeners)
        self.processes = max(1, processes)
        self.rate = rate
        self._read = read

    def queued(self) -> int:
        total = 0
        for sock in self.listeners:
            found = self._read(sock)
            total += found[0] if found else 0
        return total

    def wait_s(self) -> float:
        queued = self.queued()
        if queued < MIN_LISTEN_QUEUE:
            return 0.0
        per_s = self.rate.per_s() * self.processes
        # Requests per second overstate accepts (keep-alive connections carry several),
        # so this underestimates the wait: the backlog sheds late rather than wrongly.
        return math.inf if per_s <= 0 else queued / per_s
