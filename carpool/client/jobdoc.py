"""A job's document as the server describes it (``JobDoc``), and the errors about one
job: it failed, or it was not final in time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from carpool.client.errors import ClientError

#: The statuses after which a job never changes again.
FINAL = frozenset({"done", "failed", "expired", "cancelled"})


@dataclass(frozen=True)
class JobDoc:
    """The job document's main fields; ``doc`` is the whole document."""

    id: str
    status: str
    model: str
    result: Any = None
    error: str | None = None
    doc: Mapping[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def queue_position(self) -> int | None:
        """Its place in its bin while queued (0: next), as last described."""
        position = self.doc.get("queue_position")
        return position if isinstance(position, int) else None

    @property
    def model_version(self) -> str | None:
        """The model version it was admitted to (and, once it ran, that ran it)."""
        version = self.doc.get("model_version")
        return version if isinstance(version, str) else None

    def outcome(self) -> Any:
        """The result of a done job; raises ``JobFailed`` for any other final status."""
        if self.status != "done":
            raise JobFailed(self)
        return self.result


class JobFailed(ClientError):
    """Raised when a job ended failed, expired or cancelled instead of done."""

    def __init__(self, job: JobDoc) -> None:
        super().__init__(f"job {job.id} {job.status}: {job.error or 'no reason given'}")
        self.job = job


class JobTimeout(ClientError):
    """Raised when a job is not final within the time the caller gave it."""

    def __init__(self, job: JobDoc, timeout_s: float) -> None:
        super().__init__(f"job {job.id} still {job.status} after {timeout_s:g} s")
        self.job = job
