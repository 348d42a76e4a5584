"""A bulk batch (OpenAI's ``/v1/batches``): its status and a typed, read-only view of
its record, as ``carpool/core/jobs.py`` has ``JobStatus`` and ``JobView`` for a job.

The record is one Redis hash (carpool/backend/bulkdb.py); ``BulkView.from_hash``
reads it once, so no caller reads raw fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class BulkStatus(StrEnum):
    """A bulk batch's status, with OpenAI's names (docs/batches.md)."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        """True for a status the batch never leaves."""
        return self in FINAL


#: The statuses a batch never leaves.
FINAL = frozenset({BulkStatus.FAILED, BulkStatus.COMPLETED, BulkStatus.EXPIRED,
                   BulkStatus.CANCELLED})
#: The record's Unix-second timestamps, one per status it reached, and its deadline.
STAMPS = ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
          "expired_at", "cancelling_at", "cancelled_at", "expires_at")
#: The service tier of a record made before batches had one: its key's tier then is
#: unknown, and its lines were admitted under ``default``.
UNRECORDED_TIER = "default"


@dataclass(frozen=True)
class RequestCounts:
    """Lines in the batch, and how many ended with a result or an error so far."""

    total: int
    completed: int
    failed: int


@dataclass(frozen=True)
class BulkView:
    """One bulk batch's record, typed."""

    id: str
    status: BulkStatus
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    #: Each of STAMPS the batch has reached (Unix seconds); None: not reached.
    stamps: Mapping[str, int | None]
    counts: RequestCounts
    #: Chunks of ended lines written to the file store so far (feeder/chunks.py).
    chunks: int
    output_file_id: str | None = None
    error_file_id: str | None = None
    #: OpenAI's ``errors`` object (a failed validation), as stored: JSON.
    errors: Any = None
    metadata: Any = None
    model: str | None = None
    webhook: str | None = None
    #: When the batch ends at its rate so far (Unix seconds), and whether that is past
    #: its window (docs/batches.md).
    projected_at: int | None = None
    at_risk: bool = False
    #: When the feeder found the input file gone while lines were unfinished (Unix
    #: seconds): the batch winds down, its finished lines kept (feeder/intake.py).
    input_lost_at: int | None = None
    #: The service tier its lines are admitted under, decided at creation
    #: (carpool/admission/tiers.py; docs/batches.md).
    service_tier: str = UNRECORDED_TIER

    @property
    def expires_at(self) -> int:
        return self.stamps.get("expires_at") or 0

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> BulkView:
        """The view of a batch's hash, decoded to strings."""
        def stamp(name: str) -> int | None:
            return int(float(h[name])) if h.get(name) else None

        def loaded(name: str) -> Any:
            return json.loads(h[name]) if h.get(name) else None

        return cls(
            id=h["id"], status=BulkStatus(h["status"]), owner=h.get("owner", ""),
            endpoint=h["endpoint"], input_file_id=h["input_file_id"],
            completion_window=h.get("completion_window", ""),
            stamps={name: stamp(name) for name in STAMPS},
            counts=RequestCounts(int(h.get("total", 0)), int(h.get("completed", 0)),
                                 int(h.get("failed", 0))),
            chunks=int(h.get("chunks", 0)),
            output_file_id=h.get("output_file_id") or None,
            error_file_id=h.get("error_file_id") or None,
            errors=loaded("errors"), metadata=loaded("metadata"),
            model=h.get("model") or None, webhook=h.get("webhook") or None,
            projected_at=stamp("projected_at"), at_risk=h.get("at_risk") == "1",
            input_lost_at=stamp("input_lost_at"),
            service_tier=h.get("service_tier") or UNRECORDED_TIER)
