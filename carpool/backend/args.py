"""The arguments of every Lua script the backend calls, one frozen dataclass each.

The fields are the script's fixed ARGV in order, named as its header names them;
``KEYS`` and ``REST`` name its keys and its runs of ARGV after the fields
(carpool/core/script_args.py; ``tests/unit/test_script_args.py`` checks each against its
script's header). admit.lua's are admission's ``AdmitArgs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from carpool.admission.admit_args import AdmitArgs
from carpool.core.script_args import ScriptArgs

_K = tuple[str, ...]


@dataclass(frozen=True)
class ClaimArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "claim"
    KEYS: ClassVar[_K] = ("bin", "leases", "bytes", "claim", "outbox", "hook_wake")

    max_n: int
    lease_ms: int
    token: str
    job_prefix: str
    worker: str
    done_channel: str
    result_ttl_s: int
    scan_budget: int
    queued_ttl_s: int
    claimed_channel: str
    cost_a_ms: float
    cost_b_ms: float


@dataclass(frozen=True)
class PeekArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "peek"
    KEYS: ClassVar[_K] = ("bins*", "stats*")
    REST: ClassVar[_K] = ("scans",)

    job_prefix: str


@dataclass(frozen=True)
class CompleteArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "complete"
    KEYS: ClassVar[_K] = ("leases", "stats", "claim", "model_stats", "outbox", "hook_wake",
                          "bins*", "bin_stats*")
    REST: ClassVar[_K] = ("per_job", "scans")

    token: str
    job_prefix: str
    done_channel: str
    result_ttl_s: int
    batch_json: str
    drain_tau_ms: int
    results_channel: str
    pushed: str
    jobs: int
    late: int
    hooks: str
    usage_prefix: str
    usage_ttl_s: int
    usage: str
    busy_ms: int


@dataclass(frozen=True)
class FailQueuedArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "fail_queued"
    KEYS: ClassVar[_K] = ("bin", "bytes", "outbox", "hook_wake")

    job_prefix: str
    done_channel: str
    result_ttl_s: int
    message: str
    max_n: int


@dataclass(frozen=True)
class CancelArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "cancel"
    KEYS: ClassVar[_K] = ("job", "outbox", "hook_wake")

    id: str
    bin_prefix: str
    done_channel: str
    result_ttl_s: int
    bytes_prefix: str
    results_channel: str
    notify: int
    queued_only: int = 0
    reason: str = "cancelled by the client"


@dataclass(frozen=True)
class ReadArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "read"
    KEYS: ClassVar[_K] = ("jobs*",)

    bin_prefix: str
    job_prefix: str


@dataclass(frozen=True)
class RenewArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "renew"
    KEYS: ClassVar[_K] = ("leases", "claim")
    REST: ClassVar[_K] = ("ids",)

    token: str
    lease_ms: int


@dataclass(frozen=True)
class ReleaseArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "release"
    KEYS: ClassVar[_K] = ("leases", "claim")
    REST: ClassVar[_K] = ("ids",)

    token: str
    job_prefix: str
    bin_prefix: str
    wake_prefix: str
    wake_cap: int
    refund: bool


@dataclass(frozen=True)
class ReclaimArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "reclaim"
    KEYS: ClassVar[_K] = ("leases",)

    token_prefix: str


@dataclass(frozen=True)
class ReapArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "reap"
    KEYS: ClassVar[_K] = ("leases", "dead", "outbox", "hook_wake")
    REST: ClassVar[_K] = ("ttls",)

    batch: int
    max_attempts: int
    job_prefix: str
    bin_prefix: str
    wake_prefix: str
    done_channel: str
    dead_cap: int
    wake_cap: int
    result_ttl_s: int
    claim_prefix: str


@dataclass(frozen=True)
class AuditArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "audit"
    KEYS: ClassVar[_K] = ("leases",)

    bin_glob: str
    job_glob: str
    job_prefix: str
    claim_prefix: str


@dataclass(frozen=True)
class HeartbeatArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "heartbeat"
    KEYS: ClassVar[_K] = ("workers",)

    worker: str
    ttl_ms: int
    doc: str


@dataclass(frozen=True)
class GpuClaimArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "gpu_claim"
    KEYS: ClassVar[_K] = ("gpus*",)

    holder: str
    lease_ms: int


@dataclass(frozen=True)
class GpuRenewArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "gpu_renew"
    KEYS: ClassVar[_K] = ("gpu",)

    holder: str
    lease_ms: int


@dataclass(frozen=True)
class GpuReleaseArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "gpu_release"
    KEYS: ClassVar[_K] = ("gpu", "free")

    holder: str
    uuid: str
    free_cap: int


@dataclass(frozen=True)
class HookTakeArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "hook_take"
    KEYS: ClassVar[_K] = ("outbox",)

    max_n: int
    lease_ms: int
    state_prefix: str


@dataclass(frozen=True)
class HookSettleArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "hook_settle"
    KEYS: ClassVar[_K] = ("outbox", "state", "dead", "record")

    member: str
    event: str
    outcome: str
    delay_ms: int
    state_json: str
    state_ttl_s: int
    dead_cap: int
    dead_entry: str
    leased_ms: int
    body: str


@dataclass(frozen=True)
class HookExpireArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "hook_expire"
    KEYS: ClassVar[_K] = ("outbox", "dead")

    max_age_ms: int
    max_n: int
    dead_cap: int


#: Every script called from Python, with its arguments.
@dataclass(frozen=True)
class ComingArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "coming"
    KEYS: ClassVar[_K] = ("model_stats",)

    starting: int
    ready_in_ms: int


@dataclass(frozen=True)
class ModelStateArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "model_state"
    KEYS: ClassVar[_K] = ("model_stats",)

    action: str
    config: str
    expect: int


@dataclass(frozen=True)
class PinnedArgs(ScriptArgs):
    SCRIPT: ClassVar[str] = "pinned"
    KEYS: ClassVar[_K] = ("leases", "bins*")

    claim_prefix: str


SCRIPTS: tuple[type[ScriptArgs], ...] = (
    AdmitArgs, ClaimArgs, PeekArgs, CompleteArgs, CancelArgs, ReadArgs, RenewArgs,
    ReleaseArgs, ReapArgs, AuditArgs, HeartbeatArgs, GpuClaimArgs, GpuRenewArgs,
    GpuReleaseArgs, FailQueuedArgs, ReclaimArgs, HookTakeArgs, HookSettleArgs,
    HookExpireArgs, ComingArgs, ModelStateArgs, PinnedArgs)
