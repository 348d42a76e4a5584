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
  by Little's law, that length over the rate the web serves requests: each of the
  processes sharing the socket serves one per its measured CPU per request
  (``ServiceRate``).

Each read is one ``getsockopt``, about 1 µs. Elsewhere (no ``TCP_INFO``, a Unix
socket) both answer None and shed nothing.
"""

from __future__ import annotations

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

#: The CPU per request is measured over windows of at least this long ...
CPU_WINDOW_S = 0.25
#: ... holding at least this many requests (an idle spell's background CPU, spread
#: over a handful of requests, would read as a costly request) ...
CPU_WINDOW_MIN_REQUESTS = 20
#: ... within this long: a longer window spans an idle spell (background CPU, few
#: requests) and is dropped, not measured.
CPU_WINDOW_MAX_S = 1.0
#: Each window's figure weighs this much in the running estimate.
CPU_WEIGHT = 0.3
#: Fewer queued connections than this never count as a backlog: a handful of
#: arrivals at once is no overload.
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


class ServiceRate:
    """What one request costs this process in CPU seconds, measured as it serves.

    CPU, not wall time: an idle web, or one that just took a burst, still knows what
    a request costs, so a burst of connections is not mistaken for a backlog. The
    process's CPU covers all it does per request (parsing, long-polls' wake-ups,
    Redis replies). A process that a busy host denies a full core serves slower than
    this says: waits derived from it are underestimates, and ``queued`` (the measured
    wait) catches the rest.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self._clock = clock
        self._cpu = cpu
        self._cpu_per_request_s = 0.0
        self._count = 0
        self._since = clock()
        self._cpu_since = cpu()

    def tick(self) -> None:
        """One request taken; every CPU_WINDOW_S, fold the window's CPU per request in."""
        self._count += 1
        now = self._clock()
        elapsed_s = now - self._since
        if elapsed_s < CPU_WINDOW_S:
            return
        if self._count >= CPU_WINDOW_MIN_REQUESTS and elapsed_s <= CPU_WINDOW_MAX_S:
            cpu_now = self._cpu()
            sample_s = (cpu_now - self._cpu_since) / self._count
            old = self._cpu_per_request_s
            self._cpu_per_request_s = sample_s if old == 0 else (
                old + CPU_WEIGHT * (sample_s - old))
        elif elapsed_s < CPU_WINDOW_MAX_S:
            return  # too few requests yet: keep gathering
        self._count = 0
        self._since = now
        self._cpu_since = self._cpu()

    def cpu_per_request_s(self) -> float:
        """The running estimate; 0 until a window has been measured."""
        return self._cpu_per_request_s


class ListenBacklog:
    """The expected wait of a connection entering the accept queue(s) now, in seconds."""

    def __init__(self, listeners: Sequence[Any], processes: int, rate: ServiceRate,
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
        # Each queued connection carries at least one request; the processes sharing
        # the socket take them in parallel.
        return queued * self.rate.cpu_per_request_s() / self.processes
