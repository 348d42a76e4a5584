"""admit.lua's arguments, named in one place.

``AdmitArgs`` holds ARGV[1..23] in the script's order, each field named as the
script's header names that position (``tests/redis/test_queue_scripts.py`` reads the
header and checks both, and that the jobs start where the script looks for
them); the jobs' (id, input JSON) pairs follow them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields


@dataclass(frozen=True)
class AdmitArgs:
    """One admit.lua call's arguments before its jobs, in ARGV order."""

    job_prefix: str
    model: str
    bin: str
    max_depth: int
    max_batch: int
    queued_ttl_s: int
    idempotent: bool
    wake_cap: int
    drain_tau_ms: int
    deadline_ms: int  # effective: the model's default already applied
    priority: int
    sort_offset_ms: int
    owner: str
    input_digest: str
    max_queue_ms: int
    drain_min_age_ms: int
    drain_stale_ms: int
    owner_weight: float
    fair_share_near: float
    fair_lead_cap_ms: int
    max_queued_bytes: int
    key_queued_bytes: int
    admitted_channel: str

    def argv(self, jobs: Sequence[tuple[str, str]]) -> list[str | int]:
        """The script's ARGV: these values (as Redis reads them), then each job's id and
        input."""
        out: list[str | int] = [_arg(v) for v in astuple(self)]
        for job_id, input_json in jobs:
            out += [job_id, input_json]
        return out


def _arg(value: object) -> str | int:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    assert isinstance(value, str | int)
    return value


#: ARGV's position of the first job's id (1-based, as in Lua).
FIRST_JOB = len(fields(AdmitArgs)) + 1
