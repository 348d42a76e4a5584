"""``python -m tests.support.feeder_held POINT:N``: the real feeder, held the N-th time
it reaches POINT, a spot between two of its writes, until the test kills it with
SIGKILL. No kill from outside can land between two writes a few microseconds apart;
holding there is test-side, so the shipped feeder carries no crash switch.

POINTS: ``admitted`` (lines admitted, not yet recorded as admitted), ``chunk`` (a chunk
written to the file store, its lines not yet marked stored), ``finalize`` (the output
files written, the batch not yet moved to its final status), ``ended`` (just moved to
its final status: what follows the end is cut off).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from carpool.backend.bulkdb import BulkDb
from carpool.core.bulk import FINAL
from feeder import __main__ as feeder_main
from feeder import chunks

log = logging.getLogger("carpool.feeder")

#: What the feeder logs when it is held; the test waits for this line, then kills it.
HELD = "feeder held at"


def hold_before(point: str, n: int, fn: Callable[..., Any],
                reached: Callable[..., bool] = lambda *a, **k: True) -> Callable[..., Any]:
    """``fn``, which holds forever instead of running at its n-th reaching call."""
    calls = [0]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if reached(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                log.warning("%s %s:%d", HELD, point, n)
                threading.Event().wait()
        return fn(*args, **kwargs)
    return wrapper


def hold_after(point: str, n: int, fn: Callable[..., Any],
               reached: Callable[..., bool] = lambda *a, **k: True) -> Callable[..., Any]:
    """``fn``, which holds forever once its n-th reaching call has returned."""
    held = hold_before(point, n, lambda: None)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if reached(*args, **kwargs):
            held()
        return result
    return wrapper


def main(spec: str) -> None:
    point, _, count = spec.partition(":")
    n = int(count)
    if point == "admitted":
        BulkDb.record_admitted = hold_before(point, n, BulkDb.record_admitted)  # type: ignore[method-assign]
    elif point == "chunk":
        chunks.write_chunk = hold_after(point, n, chunks.write_chunk)
    elif point in ("finalize", "ended"):
        hold = hold_before if point == "finalize" else hold_after
        BulkDb.move = hold(  # type: ignore[method-assign]
            point, n, BulkDb.move, lambda db, batch_id, allowed_from, to, **f: to in FINAL)
    else:
        raise SystemExit(f"unknown point {point!r}: admitted, chunk, finalize or ended")
    sys.exit(feeder_main.main())


if __name__ == "__main__":
    main(sys.argv[1])
