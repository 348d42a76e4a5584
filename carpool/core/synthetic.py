"""The synthetic model's arithmetic, shared by the worker (which computes it) and
the bench and tests (which check it): a result delivered to the wrong job shows."""

from __future__ import annotations

import hashlib
import json
from typing import Any

#: Hex characters of the checksum kept in a result.
CHECKSUM_CHARS = 16


def canonical_json(value: Any) -> str:
    """One encoding per value: compact, keys sorted."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def checksum(job_input: Any) -> str:
    """A digest of the whole input, so a misrouted result cannot pass for the right one."""
    return hashlib.sha256(canonical_json(job_input).encode()).hexdigest()[:CHECKSUM_CHARS]


def expected_result(job_input: dict[str, Any]) -> dict[str, Any]:
    return {"echo": job_input.get("value"), "checksum": checksum(job_input)}


def batch_cost_s(n: int, a_ms: float, b_ms: float) -> float:
    """What a batch of n costs, in seconds: a + b·n milliseconds."""
    return (a_ms + b_ms * n) / 1000.0
