"""What Flower shows of carpool: each batch as a task, and each worker's GPU and limits.

Jobs never travel as Celery messages (that would cost a message per job); instead
the loop sends the events a task would send — received, started, succeeded or
failed — for one pseudo-task per batch, named ``carpool.batch``. Each event would
be a Redis round trip of its own, three per batch, as many as the batch's claim
and completion together; so they are buffered and go together as one message
(Celery's ``task-multi``, which Flower reads like single events, each with its own
time). A busy worker sends one such message for many batches: when a batch ends
and the oldest buffered event is ``FLUSH_EVERY_S`` old, and at a claim when nothing
was sent for ``FLUSH_EVERY_S`` (so a long batch shows as started while it runs).
A worker that goes idle (``on_idle``), a batch that fails to complete, and a stop
send what is buffered at once. So while the worker is busy Flower shows a batch
at most about ``FLUSH_EVERY_S`` late (plus the runtime of a batch claimed
meanwhile: nothing is sent while it computes), and at once when it idles.

A worker's GPU, models and current batch limits go into `celery inspect stats`
(``worker_info``), which Flower shows on the worker's page, in its "Other" tab: one
readable row per fact (``flower_rows``), named ``carpool gpu``, ``carpool models``
and ``carpool <model>/<bin>``. Programs read the same with ``celery inspect
carpool_scheduler``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from carpool.core.jobs import Claim
from worker.device.gpu import Gpu, describe_gpu
from worker.loop.loop import BatchLoop
from worker.loop.observers import BatchReport, Observer

#: The task name under which batches appear in Flower.
BATCH_TASK_NAME = "carpool.batch"
#: Longest an event waits in the buffer while the worker is busy: at most one
#: message per this while batches keep coming (plus one each time the worker idles).
FLUSH_EVERY_S = 1.0
#: Events buffered at most before they are sent anyway (Celery's ``buffer_limit``).
BUFFER_LIMIT = 1000


class FlowerBatchEvents(Observer):
    """An observer of ``BatchLoop`` that sends task events under one hostname."""

    def __init__(self, app: Any, hostname: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._app = app
        self._hostname = hostname
        self._dispatcher: Any = None
        self._task_ids: dict[str, str] = {}
        self._clock = clock
        self._sent_at_s = -FLUSH_EVERY_S  # clock when the last message went
        self._oldest_unsent_at_s: float | None = None  # clock of the oldest buffered event
        self._unsent = 0  # events buffered

    def _send(self, event_type: str, **fields: Any) -> None:
        if self._dispatcher is None:
            # Created in the loop's own thread: a dispatcher's connection is not thread-safe.
            self._dispatcher = self._app.events.Dispatcher(
                self._app.connection_for_write(), hostname=self._hostname, enabled=True,
                buffer_group=["task"], buffer_limit=BUFFER_LIMIT)
        if self._oldest_unsent_at_s is None:
            self._oldest_unsent_at_s = self._clock()
        self._dispatcher.send(event_type, **fields)
        self._unsent += 1
        if self._unsent >= BUFFER_LIMIT:
            # The dispatcher has just sent them itself (its buffer_limit, the same
            # count): this only starts our count afresh, publishing nothing.
            self._flush()

    def _flush(self) -> None:
        """Send what is buffered as one message; no round trip when nothing is."""
        if self._unsent and self._dispatcher is not None:
            self._dispatcher.flush()
            self._sent_at_s = self._clock()
        self._unsent, self._oldest_unsent_at_s = 0, None

    def _oldest_unsent_age_s(self) -> float:
        return 0.0 if self._oldest_unsent_at_s is None else (
            self._clock() - self._oldest_unsent_at_s)

    def on_claimed(self, claim: Claim) -> None:
        task_id = str(uuid.uuid4())
        self._task_ids[claim.token] = task_id
        args = repr((claim.model, claim.bin, len(claim.jobs)))
        kwargs = repr({"model": claim.model, "bin": claim.bin, "size": len(claim.jobs),
                       "lease": claim.token})
        self._send("task-received", uuid=task_id, name=BATCH_TASK_NAME, args=args,
                   kwargs=kwargs, retries=0, eta=None, root_id=task_id, parent_id=None)
        self._send("task-started", uuid=task_id)
        # Nothing else is sent until this batch ends, however long it runs: after a
        # quiet FLUSH_EVERY_S (an idle worker's buffer is empty, so the oldest-event
        # rule alone would hold it) it shows as started at once. Busy, this is the
        # oldest-event rule's message, a little early: buffered events are all newer
        # than the last message.
        if self._clock() - self._sent_at_s >= FLUSH_EVERY_S:
            self._flush()

    def on_failed(self, claim: Claim) -> None:
        self._task_ids.pop(claim.token, None)
        self._flush()

    def on_finished(self, claim: Claim, report: BatchReport) -> None:
        task_id = self._task_ids.pop(claim.token, "")
        if not task_id:
            return
        if report.failed == report.size:
            self._send("task-failed", uuid=task_id, exception=f"all {report.size} jobs failed",
                       traceback="", timestamp=time.time())
        else:
            result = repr({"size": report.size, "failed": report.failed,
                           "refused": report.refused})
            self._send("task-succeeded", uuid=task_id, result=result, runtime=report.runtime_s)
        # Busy, batches end many times a FLUSH_EVERY_S: they share a message. An event
        # waits at most FLUSH_EVERY_S for it (or less: until the worker idles).
        if self._oldest_unsent_age_s() >= FLUSH_EVERY_S:
            self._flush()

    def on_idle(self) -> None:
        # Nothing will end or be claimed until a job comes: show the last batches now.
        self._flush()

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.flush()
            self._dispatcher.close()
            self._dispatcher.connection.release()
            self._dispatcher = None
        self._unsent, self._oldest_unsent_at_s = 0, None


def worker_info(loop: BatchLoop | None, gpu: Gpu | None) -> dict[str, Any]:
    """The worker's GPU, models and each bin's limits as its next batch sees them: as
    retuned (``carpool_tune``), max_batch after the SLO's and the memory guard's caps."""
    limits = loop.live_limits() if loop is not None else {}
    return {
        "gpu": describe_gpu(gpu),
        "models": sorted(loop.handlers) if loop is not None else [],
        "batch_limits": {f"{model}/{bin_name}": {"max_batch": lim.max_batch,
                                                  "max_wait_ms": lim.max_wait_ms,
                                                  "adaptive": lim.adaptive,
                                                  "paused": lim.paused}
                         for (model, bin_name), lim in sorted(limits.items())},
    }


def flower_rows(info: dict[str, Any]) -> dict[str, str]:
    """``worker_info`` as rows Flower prints one per line: a name and a plain sentence
    (Flower shows a nested dict as its raw repr)."""
    gpu = info["gpu"]
    rows = {"carpool gpu": (f"{gpu['name']} ({gpu['uuid']})" if gpu["device"] == "cuda"
                            else gpu["device"]),
            "carpool models": ", ".join(info["models"]) or "none"}
    for key, lim in info["batch_limits"].items():
        rows[f"carpool {key}"] = (
            f"max_batch {lim['max_batch']}, max_wait_ms {lim['max_wait_ms']}, "
            f"{'adaptive' if lim['adaptive'] else 'fixed window'}, "
            f"{'paused' if lim['paused'] else 'running'}")
    return rows
