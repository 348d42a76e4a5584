"""Writing a batch's results: fenced by the lease token, retried while Redis is away.

The results of a batch are the expensive part of a job (a GPU computed them), so a
worker that holds them keeps them and retries the write with backoff when Redis is
unreachable, restarting, hung or dropped the connection mid-write. The write is
fenced (complete.lua writes a job only while the lease is still this claim's), so a
retry of a write that did go through the first time is refused, never doubled.

The worker gives up on a batch only when it is asked to stop (after one more try),
or when the batch has run past ``CARPOOL_MAX_BATCH_MS`` (the lease keeper no longer
renews it then). The loop hands a batch given up on back through its lease keeper,
or, with Redis away, lets the lease lapse.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from carpool.backend.queue import Queue
from carpool.backend.replies import Completed
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import BackendUnavailable, CarpoolError
from carpool.core.jobs import Claim, Outcome

log = logging.getLogger(__name__)

#: Back-off between two tries of one write: short at first (a dropped connection is
#: back at once), capped so a returning Redis gets the results within this bound.
RETRY_MIN_S, RETRY_MAX_S = 0.05, 2.0


#: Statuses that complete.lua writes.
_FINAL = frozenset({"done", "failed"})


class GaveUp(CarpoolError):
    """Raised when a batch's results could not be written and the worker stopped trying."""


@dataclass
class CompletionWriter:
    """Writes one batch's outcomes, retrying while Redis is away."""

    queue: Queue
    #: Set when the worker is asked to stop: no more retries after that.
    stopping: threading.Event
    #: How long a batch may hold its results unwritten, from its claim (seconds).
    max_batch_s: float
    #: The name claims are made under (claim.lua records it in each job).
    worker: str
    clock: Callable[[], float] = time.perf_counter
    #: Tries that failed and were retried (each outage adds its count; for metrics/tests).
    retries: int = field(default=0, init=False)

    def write(self, spec: ModelSpec, claim: Claim, outcomes: Sequence[Outcome],
              batch: dict[str, Any], started_s: float, peek: Sequence[str] = (),
              scan: Sequence[int] = (), busy_from_s: float | None = None) -> Completed:
        """Per job: True written, False refused (lease lost); with ``peek``, the state
        of those bins of the model right after (``Queue.complete``). ``busy_from_s``:
        when the worker began on this batch alone (after the batch before it ended),
        on ``clock``; None: from ``started_s``. Raises ``GaveUp``."""
        backoff_s = RETRY_MIN_S
        first_failure_s: float | None = None
        while True:
            try:
                now_s = self.clock()
                ran_ms = round((now_s - started_s) * 1000)
                busy_ms = round((now_s - (started_s if busy_from_s is None else busy_from_s))
                                * 1000)
                done = self.queue.complete(spec, claim, outcomes, batch, peek, scan,
                                           ran_ms=ran_ms, busy_ms=max(1, busy_ms))
            except BackendUnavailable as exc:
                now_s = self.clock()
                if first_failure_s is None:
                    first_failure_s = now_s
                    log.warning("results of %s not written (%s); retrying every %.1f s at "
                                "most while Redis is away", claim.token, exc, RETRY_MAX_S)
                if self.stopping.is_set() or now_s - started_s >= self.max_batch_s:
                    raise GaveUp(f"gave up writing the {len(outcomes)} results of "
                                 f"{claim.token}: {exc}") from exc
                self.retries += 1
                self.stopping.wait(backoff_s)
                backoff_s = min(RETRY_MAX_S, backoff_s * 2)
                continue
            if first_failure_s is not None:
                done = replace(done, written=self._count_lost_replies(claim, done.written))
                log.warning("results of %s written after Redis was away %.1f s", claim.token,
                            self.clock() - first_failure_s)
            return done

    def _count_lost_replies(self, claim: Claim, written: list[bool]) -> list[bool]:
        """A try whose reply was lost (a timeout, a dropped connection) may have written
        the results after all; the retry then finds the leases ended and is refused.
        Such a job ended under this very claim: its record still names this worker (in
        its batch) and this claim's time. Those count as written (metrics, logs); the
        rest were lost."""
        refused = [j.id for j, ok in zip(claim.jobs, written, strict=True) if not ok]
        if not refused:
            return written
        try:
            found = self.queue.read_records(refused)  # never an input: a requeued job's
        except BackendUnavailable:
            return written  # only the counts are at stake
        ours = {job_id for job_id, fields in zip(refused, found, strict=True)
                if fields and fields.get("status") in _FINAL
                and fields.get("t_claim") == str(claim.now_ms)
                and _batch_worker(fields.get("batch")) == self.worker}
        return [ok or j.id in ours for j, ok in zip(claim.jobs, written, strict=True)]


def _batch_worker(batch: str | None) -> str | None:
    """The worker a finished record's batch names (complete.lua writes it there)."""
    try:
        return str(json.loads(batch)["worker"]) if batch else None
    except (ValueError, KeyError, TypeError):
        return None
