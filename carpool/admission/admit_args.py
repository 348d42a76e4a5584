"""admit.lua's arguments, named in one place.

``AdmitArgs`` holds ARGV[1..30] in the script's order, each field named as the
script's header names that position (carpool/core/script_args.py's mechanism, as
for every script; ``tests/unit/test_script_args.py`` checks the header); the jobs'
(id, input JSON) pairs follow them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

from carpool.admission.tiers import DEFAULT_TIER
from carpool.core.script_args import Arg, ScriptArgs, argv


@dataclass(frozen=True)
class AdmitArgs(ScriptArgs):
    """One admit.lua call's arguments before its jobs, in ARGV order."""

    SCRIPT: ClassVar[str] = "admit"
    KEYS: ClassVar[tuple[str, ...]] = ("bin", "wake", "idem", "stats", "tenants", "bytes",
                                       "owner_bytes", "model_stats", "other_bins*")
    REST: ClassVar[tuple[str, ...]] = ("jobs",)

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
    hook: str = ""  # the record's webhook field (carpool/core/webhooks.py)
    usage_prefix: str = ""  # {p.s}:usage:<model>: (carpool/backend/keys.py)
    usage_ttl_s: int = 0
    quota_device_ms_per_hour: int = 0  # the owner's quotas (the keys file; 0: none)
    quota_jobs_per_s: float = 0.0
    tier_share: float = 1.0  # of the bound and allowed wait (carpool/admission/tiers.py)
    tier: str = DEFAULT_TIER  # its name: the model's refusals are counted by it

    def argv(self, jobs: Sequence[tuple[str, str]]) -> list[Arg]:
        """The script's ARGV: these values (as Redis reads them), then each job's id and
        input."""
        return argv(self, (v for job in jobs for v in job))


#: ARGV's position of the first job's id (1-based, as in Lua).
FIRST_JOB = len(fields(AdmitArgs)) + 1
