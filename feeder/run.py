"""One bulk batch as the feeder holds it: its lines and which are admitted or stored.

Redis is the truth (carpool/backend/bulkdb.py); this is its copy in memory,
rebuilt from Redis after a restart or a lost connection.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from carpool.core.bulk import UNRECORDED_TIER, BulkStatus
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import InvalidInput
from carpool.core.jobs import JobStatus, JobView
from carpool.intake.bulk_lines import Line
from carpool.intake.embeddings import check_dimensions, embeddings_answer
from feeder.labels import Label

#: Lines past the lowest unfinished one that a feed looks at for a bin with room.
SCAN_WINDOW = 4096


def stored_set(bitmap: bytes) -> set[int]:
    """The set bits of a Redis bitmap (bit 0 is the first byte's highest bit)."""
    return {i * 8 + b for i, byte in enumerate(bitmap) if byte
            for b in range(8) if byte & (0x80 >> b)}


@dataclass(frozen=True)
class Ending:
    """Why a batch stops before all its lines ran: the error of each line that did not
    finish, and the batch's final status."""

    code: str
    message: str
    final: BulkStatus
    #: The batch's own error (its ``errors``) when ``final`` is ``failed``.
    bulk_error: str = ""


def ending_of(status: BulkStatus, input_lost: bool, expired: bool, input_file_id: str
              ) -> Ending | None:
    """The batch's ending, or None while it runs on. A cancel goes first (asked for);
    then a lost input (the rest cannot run), then the window."""
    if status is BulkStatus.CANCELLING:
        return Ending("batch_cancelled", "the batch was cancelled first", BulkStatus.CANCELLED)
    if status is not BulkStatus.IN_PROGRESS:
        return None
    if input_lost:
        return Ending("input_file_deleted", f"the batch's input file {input_file_id} was "
                      "deleted before this line finished", BulkStatus.FAILED,
                      f"the input file {input_file_id} was deleted before every line "
                      "finished: the finished lines are in the output file, the others in "
                      "the error file (input_file_deleted)")
    if expired:
        return Ending("batch_expired", "the batch's completion window ended first",
                      BulkStatus.EXPIRED)
    return None


@dataclass
class Run:
    id: str
    owner: str
    spec: ModelSpec
    endpoint: str
    #: The input's lines; empty when the input file was gone at load (nothing to feed).
    lines: list[Line]
    labels: list[Label]  # one per line, even when ``lines`` is empty
    expires_at: float  # Unix seconds
    chunks: int
    jobs: dict[int, list[str]] = field(default_factory=dict)  # admitted, not stored
    stored: set[int] = field(default_factory=set)
    next: int = 0  # every line below it is admitted or stored
    #: (time, lines stored) when the rate was last sampled, for the projection.
    sampled: tuple[float, int] = (0.0, 0)
    rate_per_s: float = 0.0
    #: The input file was found gone; when it was last looked for (monotonic s).
    input_gone: bool = False
    input_checked_at: float = 0.0
    #: Set once the batch winds down: the error of its lines that end unanswered.
    ending: Ending | None = None
    #: The service tier every line is admitted and refused under (its record's).
    tier: str = UNRECORDED_TIER

    @property
    def total(self) -> int:
        return len(self.labels)

    def advance(self) -> None:
        while self.next < self.total and (self.next in self.stored or self.next in self.jobs):
            self.next += 1

    def waiting(self) -> Iterator[int]:
        """Lines in the scan window that are neither admitted nor stored, in order
        (lazily: a feed usually stops after a few)."""
        end = min(len(self.lines), self.next + SCAN_WINDOW)
        return (i for i in range(self.next, end)
                if i not in self.stored and i not in self.jobs)

    @property
    def unstored(self) -> list[int]:
        return [i for i in range(self.total) if i not in self.stored]

    def idempotency(self, line: int, k: int) -> str:
        """The idempotency digest of job ``k`` of ``line``: an admission repeated after a
        crash answers the job admitted before it."""
        return hashlib.sha256(f"batch\0{self.id}\0{line}\0{k}".encode()).hexdigest()


def request_id(run: Run, line: int) -> str:
    return "batch_req_" + hashlib.sha256(f"{run.id}\0{line}".encode()).hexdigest()[:24]


def ended_line(run: Run, line: int, views: list[JobView]) -> tuple[bool, str]:
    """(success, the output/error file line) of a line whose jobs all ended. A job
    withdrawn while the batch winds down carries the batch's ending."""
    label = run.labels[line]
    base: dict[str, Any] = {"id": request_id(run, line), "custom_id": label.custom_id}
    bad = next((v for v in views if v.status is not JobStatus.DONE), None)
    if bad is None and run.endpoint == "/v1/embeddings":
        results = [v.result for v in views]
        try:
            check_dimensions({"dimensions": label.dimensions}, results)
        except InvalidInput as exc:  # what POST /v1/embeddings answers it
            return False, _response_line(base, 400, views[0].id, {
                "error": {"code": "invalid_input", "message": str(exc),
                          "type": "invalid_request_error", "param": "dimensions"}})
        return True, _response_line(base, 200, views[0].id, embeddings_answer(
            run.spec, results, label.encoding_format))
    if bad is None:
        return True, _response_line(base, 200, views[0].id, views[0].to_json())
    if bad.status in (JobStatus.EXPIRED, JobStatus.CANCELLED):
        if run.ending is not None:
            return False, error_line(run, line, run.ending.code, run.ending.message)
        return False, error_line(run, line, _CODE[bad.status], bad.error or bad.status.value)
    return False, _response_line(base, 500, bad.id, {"error": {
        "message": bad.error or "the job failed", "type": "job_failed", "param": None,
        "code": "job_failed"}})


_CODE = {JobStatus.EXPIRED: "batch_expired", JobStatus.CANCELLED: "batch_cancelled"}


def _response_line(base: dict[str, Any], status: int, request_id: str,
                   body: dict[str, Any]) -> str:
    """A line that got an answer: ``status`` with ``body``, as the endpoint answers it."""
    return json.dumps({**base, "response": {"status_code": status, "request_id": request_id,
                                            "body": body}, "error": None},
                      separators=(",", ":"))


def error_line(run: Run, line: int, code: str, message: str) -> str:
    """A line that never got an answer: its batch expired, was cancelled or lost its
    input first, or its model was refused by every live worker."""
    custom_id = run.labels[line].custom_id
    if custom_id is None:  # its labels are gone with the input: say which line it was
        message += f" (request {line + 1} of the input file)"
    return json.dumps({"id": request_id(run, line), "custom_id": custom_id,
                       "response": None, "error": {"code": code, "message": message}},
                      separators=(",", ":"))
