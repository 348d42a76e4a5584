"""Redis calls of concurrent callers (the web's requests), coalesced into shared round trips.

Redis pays about ten times more CPU per round trip (reading a request, writing a
reply, an event-loop turn) than for reading one job hash (docs/benchmarks.md),
and a script call costs its fixed part once however many jobs it admits. Under
gunicorn's gevent worker many requests of one process reach Redis at once: a
batch completes and wakes its long-polls together; clients submit and fetch in
parallel. So calls group-commit: a call that finds none of its kind in flight
goes at once (no added latency); calls that arrive meanwhile wait for it and
then go together, in one round trip, led by the first of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 — the item, as K is the key and R the result
R = TypeVar("R")


@dataclass(eq=False)
class _Call(Generic[I, R]):
    item: I
    done: threading.Event = field(default_factory=threading.Event)
    result: R | None = None
    error: BaseException | None = None
    #: Set (with ``done``) when this call must lead the next round trip.
    lead: bool = False


@dataclass
class _Group(Generic[I, R]):
    pending: list[_Call[I, R]] = field(default_factory=list)
    busy: bool = False


class Coalescer(Generic[K, I, R]):
    """``call(key, item)``: calls with equal keys share round trips of ``flush``.

    ``flush(key, items)`` answers one result per item, in order; an exception in
    the answer is raised to that item's caller alone, one raised by ``flush`` to
    every caller of that round trip.
    """

    def __init__(self, flush: Callable[[K, list[I]], Sequence[R | BaseException]]) -> None:
        self._flush = flush
        self._lock = threading.Lock()
        self._groups: dict[K, _Group[I, R]] = {}
        #: Round trips made, for tests and anyone tuning: calls / round_trips is the gain.
        self.round_trips = 0

    def call(self, key: K, item: I) -> R:
        me: _Call[I, R] = _Call(item)
        with self._lock:
            group = self._groups.setdefault(key, _Group())
            group.pending.append(me)
            lead, group.busy = not group.busy, True
        if not lead:
            me.done.wait()
        if lead or me.lead:
            self._round_trip(key, group, me)
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]  # set whenever error is not

    def _round_trip(self, key: K, group: _Group[I, R], leader: _Call[I, R]) -> None:
        with self._lock:
            batch, group.pending = group.pending, []
            self.round_trips += 1
        try:
            answers = self._flush(key, [c.item for c in batch])
        except Exception as exc:  # noqa: BLE001 — each caller raises it, as a direct call would
            for c in batch:
                c.error = exc
        except BaseException:
            # The leader itself was cancelled (a timeout, its client gone): the
            # others' calls go with the next round trip, not down with it.
            with self._lock:
                group.pending[:0] = [c for c in batch if c is not leader]
            self._hand_off(key, group)
            raise
        else:
            for c, answer in zip(batch, answers, strict=True):
                if isinstance(answer, BaseException):
                    c.error = answer
                else:
                    c.result = answer
        for c in batch:
            c.lead = False
            c.done.set()
        self._hand_off(key, group)

    def _hand_off(self, key: K, group: _Group[I, R]) -> None:
        """The first call that waits leads the next round trip; none: idle."""
        with self._lock:
            if not group.pending:
                group.busy = False
                del self._groups[key]
                return
            nxt = group.pending[0]
            nxt.lead = True
        nxt.done.set()

    def in_flight(self) -> int:
        """Round trips under way now (tests: ``round_trips`` counts one as it starts)."""
        with self._lock:
            return sum(g.busy for g in self._groups.values())

    def waiting(self) -> int:
        """Calls waiting for a round trip now (tests)."""
        with self._lock:
            return sum(len(g.pending) for g in self._groups.values())
