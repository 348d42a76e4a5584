"""What Flower shows of carpool: each batch as a task, and each worker's GPU and limits.

Jobs never travel as Celery messages (that would cost a message per job); instead
the loop sends the events a task would send — received, started, succeeded or
failed — for one pseudo-task per batch, named ``carpool.batch``. Each event would
be a Redis round trip of its own, three per batch, as many as the batch's claim
and completion together; so they are buffered and go as one message (Celery's
``task-multi``, which Flower reads like single events, each with its own time):
when the batch ends, and at its claim when nothing was sent for
``FLUSH_EVERY_S`` (so a long batch still shows as started). A worker's GPU,
models and current batch limits go into `celery inspect stats` (``worker_info``),
which Flower shows on the worker's page, in its "Other" tab: one readable row per
fact (``flower_rows``), named ``carpool gpu``, ``carpool models`` and ``carpool
<model>/<bin>``. Programs read the same with ``celery inspect carpool_scheduler``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from carpool.jobs import Claim
from worker.gpu import Gpu, describe_gpu
from worker.hooks import BatchReport, Hooks
from worker.loop import BatchLoop

#: The task name under which batches appear in Flower.
BATCH_TASK_NAME = "carpool.batch"
#: Longest a claimed batch's events wait in the buffer when nothing else is sent.
FLUSH_EVERY_S = 1.0
#: Events buffered at most before they are sent anyway (Celery's ``buffer_limit``).
BUFFER_LIMIT = 1000


class FlowerBatchEvents(Hooks):
    """Hooks for ``BatchLoop`` that send task events under one hostname."""

    def __init__(self, app: Any, hostname: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._app = app
        self._hostname = hostname
        self._dispatcher: Any = None
        self._task_ids: dict[str, str] = {}
        self._clock = clock
        self._flushed_at = -FLUSH_EVERY_S

    def _send(self, event_type: str, **fields: Any) -> None:
        if self._dispatcher is None:
            # Created in the loop's own thread: a dispatcher's connection is not thread-safe.
            self._dispatcher = self._app.events.Dispatcher(
                self._app.connection_for_write(), hostname=self._hostname, enabled=True,
                buffer_group=["task"], buffer_limit=BUFFER_LIMIT)
        self._dispatcher.send(event_type, **fields)

    def _flush(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.flush()
        self._flushed_at = self._clock()

    def on_claimed(self, claim: Claim) -> None:
        task_id = str(uuid.uuid4())
        self._task_ids[claim.token] = task_id
        args = repr((claim.model, claim.bin, len(claim.jobs)))
        kwargs = repr({"model": claim.model, "bin": claim.bin, "size": len(claim.jobs),
                       "lease": claim.token})
        self._send("task-received", uuid=task_id, name=BATCH_TASK_NAME, args=args,
                   kwargs=kwargs, retries=0, eta=None, root_id=task_id, parent_id=None)
        self._send("task-started", uuid=task_id)
        if self._clock() - self._flushed_at >= FLUSH_EVERY_S:
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
        self._flush()

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.flush()
            self._dispatcher.close()
            self._dispatcher.connection.release()
            self._dispatcher = None


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
