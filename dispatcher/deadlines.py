"""A whole try's time bound: one thread that cuts the connections of tries past it.

A socket timeout bounds each read, not the answer: a receiver that sends one byte
of its headers every few seconds would hold a dispatcher's thread (and, with a few
such receivers, all of them) for hours. So each try also has a deadline, and a
connection past it is shut down from this thread, which wakes the blocked read.
One thread for every try of the process, not one per try: at hundreds of tries a
second, a timer thread each would cost more than the tries.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(order=True)
class _Entry:
    deadline: float
    seq: int
    sock: socket.socket = field(compare=False)  # replaced when TLS wraps it
    done: bool = field(default=False, compare=False)
    cut: bool = field(default=False, compare=False)


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def bounded(self, sock: socket.socket, limit_s: float) -> Iterator[_Entry]:
        """Shut ``sock`` down if the block still runs ``limit_s`` from now; the entry
        says whether it was (``cut``)."""
        entry = _Entry(time.monotonic() + limit_s, next(self._seq), sock)
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="carpool-hook-deadlines")
                self._thread.start()
            heapq.heappush(self._heap, entry)
            self._cv.notify()
        try:
            yield entry
        finally:
            with self._cv:
                entry.done = True

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._heap and self._heap[0].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                first = self._heap[0]
                wait_s = first.deadline - time.monotonic()
                if wait_s > 0:
                    self._cv.wait(wait_s)
                    continue
                heapq.heappop(self._heap)
                first.cut = True
            try:
                first.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: the try ended as the deadline came


#: The process's one instance (the dispatcher's tries share it).
DEADLINES = Deadlines()
