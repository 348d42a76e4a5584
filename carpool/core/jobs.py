"""Job records: what a job is at each stage, as frozen dataclasses."""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from carpool.core.shards import SHARD_CHARS, shard
from carpool.core.versions import DEFAULT_VERSION, split

#: 16 random bytes = 128 bits (≥ 122 required): ids cannot be guessed.
JOB_ID_BYTES = 16
#: The model's shard tag (carpool.core.shards.shard), then token_urlsafe(16): exactly 22
#: characters; all of [A-Za-z0-9_-].
JOB_ID_CHARS = SHARD_CHARS + 22
#: A failed job's error that starts "<code>: " with one of these codes shows the code
#: as ``error_code`` in its document too (carpool/backend/refused_models.py writes one).
MODEL_UNAVAILABLE = "model_unavailable"
JOB_ERROR_CODES = frozenset({MODEL_UNAVAILABLE})


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


def new_job_id(model: str) -> str:
    """A fresh id for a job of ``model``; it starts with the model's shard tag, so the
    job's keys are found (on its shard) from the id alone."""
    return shard(model) + secrets.token_urlsafe(JOB_ID_BYTES)


def idempotency_digest(key: str, owner: str = "") -> str:
    """What Redis stores of an idempotency key: its SHA-256, so keys of any shape fit a
    key name. With API keys, the key is scoped to its owner: two clients that pick the
    same idempotency key get two jobs, and neither learns of the other's."""
    scoped = f"{owner}\n{key}" if owner else key
    return hashlib.sha256(scoped.encode()).hexdigest()


def is_job_id(text: str) -> bool:
    """True when ``text`` has the shape of a job id (anything else is a 404, not a lookup)."""
    # isascii: str.isalnum() also accepts "é" or "٣", which token_urlsafe never makes.
    return (len(text) == JOB_ID_CHARS and text.isascii()
            and all(c.isalnum() or c in "-_" for c in text))


@dataclass(frozen=True)
class Admitted:
    """A job accepted into its bin (or, for a repeated idempotency key, the first one)."""

    id: str
    model: str
    bin: str
    depth: int
    duplicate: bool = False


@dataclass(frozen=True)
class BinState:
    """One bin as seen by a worker: how many wait, and since when the oldest.

    ``oldest_admit_ms`` and ``earliest_deadline_ms`` are over every job of a bin
    holding fewer than its ``max_batch`` (its next batch takes them all); for a
    full bin, which leaves at once anyway, over its head (most urgent job) alone.
    ``admitted`` counts the bin's admissions ever, so a worker can tell its
    arrival rate.
    """

    model: str
    bin: str
    depth: int
    oldest_admit_ms: int | None
    earliest_deadline_ms: int | None = None
    admitted: int = 0


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    input_json: str
    admit_ms: int
    attempts: int
    #: The API key's digest that submitted it ("" without keys): a pushed result
    #: carries it, so the web checks the owner without reading the record.
    owner: str = ""
    #: Its record's admission fields as the claim read them (carpool/backend/records.py),
    #: handed back with its outcome: the completion writes the ended record from them
    #: without reading the queued one. "" for a job no claim handed out (refused).
    admission: str = ""


@dataclass(frozen=True)
class Claim:
    """Jobs leased to one worker under one token, at Redis time ``now_ms``."""

    model: str
    bin: str
    token: str
    now_ms: int
    jobs: tuple[ClaimedJob, ...]
    #: Jobs the claim ended "expired" instead (past or too near their deadline, or
    #: queued too long); the worker adds those of its earlier claims that leased none,
    #: for the completion's late count (observers see each claim's own at its claim).
    expired: int = 0


@dataclass(frozen=True)
class Outcome:
    """One job's end: ``result`` when it succeeded, ``error`` when it failed."""

    id: str
    result: Any = None
    error: str | None = None
    preprocess_ms: float = 0.0
    inference_ms: float = 0.0
    #: Its share of its batch's forward time: the batch's measured inference time split
    #: by each input's padded size (docs/admission.md, "Usage"); 0: it never ran.
    device_ms: float = 0.0
    #: ``result`` as its record keeps it, strict JSON, when the worker encoded it already.
    result_json: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


def with_result_json(outcome: Outcome) -> Outcome:
    """``outcome`` with its result encoded as strict JSON, or failed saying why it cannot
    be: RFC 8259 has no NaN or Infinity (an overflow in the model), and the parsers of
    JavaScript, Go and Rust refuse them, so such a result would be an answer, a webhook
    body and a batch output line that clients cannot read."""
    if outcome.failed or outcome.result_json is not None:
        return outcome
    try:
        return replace(outcome, result_json=json.dumps(outcome.result, allow_nan=False))
    except ValueError as exc:
        why = (f"the handler's result is not JSON: {exc}"
               if "Out of range float" not in str(exc) else
               "the model's output holds NaN or Infinity, which JSON cannot carry (an "
               "overflow in the model, or an input far outside the range it was made for?)")
    except (TypeError, RecursionError) as exc:  # a tensor, a set, an object; too deep
        why = f"the handler's result is not JSON: {type(exc).__name__}: {exc}"
    return replace(outcome, result=None, error=f"invalid output: {why}", inference_ms=0.0)


def rfc3339(ms: int) -> str:
    """Redis time (ms since the epoch) as RFC 3339 UTC, to the millisecond."""
    seconds, millis = divmod(ms, 1000)
    return f"{_rfc3339_second(seconds)}.{millis:03d}Z"


@functools.lru_cache(maxsize=4096)
def _rfc3339_second(seconds: int) -> str:
    """One second's part: a job document has three times, mostly of the same few
    seconds, and formatting a datetime costs ~2 µs."""
    # isoformat, not strftime: glibc's %Y writes the year 1 as "1", not RFC 3339's "0001".
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None).isoformat("T", "seconds")


def job_urls(job_id: str) -> dict[str, str]:
    """Where a client finds the job: its document (``GET``; ``DELETE`` cancels a queued
    job), and its event stream. Relative to the server, as ``result_url`` is."""
    result = f"/result/{job_id}"
    return {"result": result, "cancel": result, "events": f"{result}/events"}


@dataclass(frozen=True)
class JobView:
    """A job as ``GET /result/<id>`` shows it."""

    id: str
    #: Its catalogue name, ``<m>@<v>`` for a declared version (carpool/core/versions.py).
    model: str
    status: JobStatus
    result: Any
    error: str | None
    timings_ms: dict[str, float] | None
    batch: dict[str, Any] | None
    owner: str
    #: Runs started, the current one included (a queued job: the runs before it).
    attempts: int | None = None
    #: Redis times (ms): admitted, claimed by the run that ended it (or runs now), ended.
    created_ms: int | None = None
    started_ms: int | None = None
    completed_ms: int | None = None
    #: Its place in its bin while queued (0: the next to be claimed).
    position: int | None = None
    #: Its webhook's delivery (carpool/backend/outbox.py ``webhook_doc``); None: no webhook.
    webhook: dict[str, Any] | None = None
    #: Once ended by a worker: {"device_ms", "queue_ms"}, what it cost (docs/admission.md).
    usage: dict[str, float] | None = None
    #: The version it was admitted to (and, once a worker ran it, the one that ran it).
    model_version: str = DEFAULT_VERSION

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "model": split(self.model)[0],
                                "model_version": self.model_version, "status": self.status.value}
        if self.status is JobStatus.DONE:
            body["result"] = self.result
        if self.error is not None:
            body["error"] = self.error
            code = self.error.partition(": ")[0]
            if code in JOB_ERROR_CODES:
                body["error_code"] = code
        if self.timings_ms is not None:
            body["timings_ms"] = self.timings_ms
        if self.batch is not None:
            body["batch"] = self.batch
        if self.usage is not None:
            body["usage"] = self.usage
        for name, ms in (("created_at", self.created_ms), ("started_at", self.started_ms),
                         ("completed_at", self.completed_ms)):
            if ms is not None:
                body[name] = rfc3339(ms)
        if self.attempts is not None:
            body["attempts"] = self.attempts
        if self.status is JobStatus.QUEUED and self.position is not None:
            body["queue_position"] = self.position
        body["urls"] = job_urls(self.id)
        if self.webhook is not None:
            body["webhook"] = self.webhook
        return body


def _ms(h: dict[str, str], name: str) -> int | None:
    raw = h.get(name)
    return int(raw) if raw else None


def view_from_record(job_id: str, h: dict[str, str],
                     versions: Mapping[str, str] | None = None) -> JobView:
    """Build the client's view from a job's record, parsed (carpool/backend/records.py);
    ``versions``: each catalogue name's version (``Catalogue.versions``)."""
    status = JobStatus(h["status"])
    timings: dict[str, float] | None = None
    usage: dict[str, float] | None = None
    if "t_done" in h:
        t_admit = int(h["t_admit"])
        worker_t = json.loads(h.get("timings", "{}"))
        claim = int(h.get("t_claim", h["t_done"]))
        timings = {
            "queue": float(claim - t_admit),
            "preprocess": float(worker_t.get("preprocess", 0.0)),
            "inference": float(worker_t.get("inference", 0.0)),
            "total": float(int(h["t_done"]) - t_admit),
        }
        if "device" in worker_t:  # ended by a worker that measured it
            usage = {"device_ms": float(worker_t["device"]), "queue_ms": timings["queue"]}
    attempts = int(h.get("attempts") or 0)
    if status is JobStatus.RUNNING:  # the record counts the runs before its claim's
        attempts += 1
    model = h.get("model", "")
    batch = json.loads(h["batch"]) if "batch" in h else None
    return JobView(
        id=job_id,
        model=model,
        status=status,
        result=json.loads(h["result"]) if "result" in h else None,
        error=h.get("error"),
        timings_ms=timings,
        batch=batch,
        owner=h.get("owner", ""),
        attempts=attempts,
        created_ms=_ms(h, "t_admit"),
        started_ms=_ms(h, "t_claim"),
        completed_ms=_ms(h, "t_done"),
        position=_ms(h, "position"),
        webhook=WEBHOOK_PENDING if "hook" in h else None,
        usage=usage,
        model_version=model_version(model, batch, versions),
    )


def model_version(model: str, batch: Mapping[str, Any] | None,
                  versions: Mapping[str, str] | None) -> str:
    """A job's version: the one its batch ran (a worker names it), else its catalogue
    name's: ``<m>@<v>`` is ``v``, ``<m>`` its entry's own (``versions``; "1" unknown)."""
    ran = batch.get("model_version") if batch is not None else None
    if isinstance(ran, str) and ran:
        return ran
    return (versions or {}).get(model) or split(model)[1] or DEFAULT_VERSION


#: A job's webhook before its first try (the outbox's delivery states replace it).
WEBHOOK_PENDING: dict[str, Any] = {"state": "pending", "attempts": 0, "last_status": None,
                                   "last_error": None}
