"""Job reads of concurrent requests, coalesced into pipelined round trips.

Redis pays about ten times more CPU per round trip (reading a request, writing a
reply, an event-loop turn) than for reading one job hash (docs/benchmarks.md).
Under gunicorn's gevent worker many requests of one process read jobs at once: a
batch completes and wakes its long-polls together; a client fetches a batch's
results in parallel. So reads group-commit: a read that finds none in flight goes
at once (no added latency); reads that arrive meanwhile wait for it and then go
together, in one pipelined round trip, led by the first of them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from carpool.jobs import JobView
from carpool.queue import Queue


@dataclass(eq=False)
class _Read:
    job_id: str
    done: threading.Event = field(default_factory=threading.Event)
    view: JobView | None = None
    error: Exception | None = None
    #: Set (with ``done``) when this read must lead the next round trip.
    lead: bool = False


class ReadBatcher:
    """``get`` like ``Queue.get``, but concurrent calls share round trips."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._lock = threading.Lock()
        self._pending: list[_Read] = []
        self._busy = False
        #: Round trips made, for tests and anyone tuning: reads / round_trips is the gain.
        self.round_trips = 0

    def get(self, job_id: str) -> JobView | None:
        read = _Read(job_id)
        with self._lock:
            self._pending.append(read)
            lead, self._busy = not self._busy, True
        if not lead:
            read.done.wait()
        if lead or read.lead:
            self._round_trip(read)
        if read.error is not None:
            raise read.error
        return read.view

    def _round_trip(self, leader: _Read) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            self.round_trips += 1
        try:
            views = self.queue.get_many([r.job_id for r in batch])
        except Exception as exc:  # noqa: BLE001 — each reader raises it, as Queue.get would
            for r in batch:
                r.error = exc
        except BaseException:
            # The leader itself was cancelled (a timeout, its client gone): the
            # others' reads go with the next round trip, not down with it.
            with self._lock:
                self._pending[:0] = [r for r in batch if r is not leader]
            self._hand_off()
            raise
        else:
            for r, view in zip(batch, views, strict=True):
                r.view = view
        for r in batch:
            r.lead = False
            r.done.set()
        self._hand_off()

    def _hand_off(self) -> None:
        """The first read that waits leads the next round trip; none: idle."""
        with self._lock:
            if not self._pending:
                self._busy = False
                return
            nxt = self._pending[0]
            nxt.lead = True
        nxt.done.set()
