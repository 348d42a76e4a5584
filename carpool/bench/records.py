"""One job's measured fate, how a result is checked to be its own, and JSON lines.

Outcomes are counted, never hidden: a misrouted or lost result is a finding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from carpool.core.synthetic import checksum


class Outcome(StrEnum):
    OK = "ok"
    #: 429: the bin was full (admission control working, not a failure of the job).
    REJECTED = "rejected"
    #: Any other refusal or a broken connection: the job never got an id.
    ERROR = "error"
    #: The server says failed, expired or cancelled.
    FAILED = "failed"
    #: A result that is not this job's: wrong id, echo or checksum.
    MISROUTED = "misrouted"
    #: Accepted, then never final before the run's deadline, or its id unknown (404).
    LOST = "lost"
    #: The client gave up (``--client-timeout-s`` after its scheduled arrival): what a
    #: real caller with a timeout would see, whatever the server did later.
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class JobRecord:
    """Times are seconds on the driver's monotonic clock from the run's start."""

    seq: int
    size: int
    t_sched: float
    t_start: float
    outcome: Outcome
    t_final: float | None = None
    http_status: int = 0
    job_id: str = ""
    bin: str = ""
    batch_size: int = 0
    worker: str = ""
    #: The result's own timings_ms: queue, preprocess, inference, total.
    timings_ms: dict[str, float] = field(default_factory=dict)
    detail: str = ""
    #: Redis's clock (ms) at admission and at completion, where the driver read them.
    server_admit_ms: int | None = None
    server_done_ms: int | None = None

    @property
    def e2e_ms(self) -> float | None:
        """From the *scheduled* arrival: a late generator cannot hide queueing."""
        if self.t_final is None:
            return None
        return (self.t_final - self.t_sched) * 1000.0

    @property
    def lateness_ms(self) -> float:
        """How late the driver started this job; large values mean it was the bottleneck."""
        return (self.t_start - self.t_sched) * 1000.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["outcome"] = self.outcome.value
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobRecord:
        return cls(**{**raw, "outcome": Outcome(raw["outcome"])})


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    detail: str = ""


def verify(job_id: str, job_input: dict[str, Any], body: dict[str, Any]) -> Verdict:
    """Judge a final ``GET /result`` body against the job that was submitted."""
    status = body.get("status")
    if body.get("id") != job_id:
        return Verdict(Outcome.MISROUTED, f"asked for {job_id}, got {body.get('id')}")
    if status != "done":
        return Verdict(Outcome.FAILED, f"{status}: {body.get('error', '')}"[:200])
    result = body.get("result")
    if not isinstance(result, dict):
        return Verdict(Outcome.MISROUTED, f"result is not an object: {str(result)[:80]}")
    if result.get("echo") != job_input["value"]:
        return Verdict(Outcome.MISROUTED, f"echo {str(result.get('echo'))[:80]}")
    expected = checksum(job_input)
    if result.get("checksum") != expected:
        return Verdict(Outcome.MISROUTED, f"checksum {result.get('checksum')} != {expected}")
    return Verdict(Outcome.OK)


def batch_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The record fields taken from a result body's ``batch`` and ``timings_ms``."""
    batch = body.get("batch") or {}
    timings = body.get("timings_ms") or {}
    return {
        "bin": str(batch.get("bin", "")),
        "batch_size": int(batch.get("size", 0)),
        "worker": str(batch.get("worker", "")),
        "timings_ms": {k: float(v) for k, v in timings.items()},
    }


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def read_records(path: Path) -> list[JobRecord]:
    return [JobRecord.from_json(row) for row in read_jsonl(path)]
