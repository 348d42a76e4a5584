"""Admission: the one way to queue jobs (``Admissions.admit``), one admit.lua call per bin.

A request names its model, its jobs (bin, id, input JSON each) and what they share
(the submission's options). Each job's place in the answer holds its ``Admitted``
or why it was refused; with ``coalesce`` (the web), concurrent one-job requests to
one bin with the same options share one admit.lua call (carpool/backend/coalescing.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from carpool.admission.admit_args import AdmitArgs
from carpool.admission.admit_reply import Refused, admit_outcomes
from carpool.admission.fair_share import FAIR_SHARE_NEAR, fair_lead_cap_ms
from carpool.admission.retry_after import DRAIN_MIN_AGE_MS, DRAIN_STALE_MS, DRAIN_TAU_MS
from carpool.admission.tiers import DEFAULT_TIER, tier_shares
from carpool.admission.urgency import effective_deadline_ms, sort_offset_ms
from carpool.backend.coalescing import Coalescer
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.queue import WAKE_LIST_CAP
from carpool.backend.usage import USAGE_KEEP_S
from carpool.core.api_keys import KeyPolicy
from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import (
    BackendUnavailable,
    BinFull,
    BudgetFull,
    IdempotencyConflict,
    ModelUnloaded,
    NotSent,
)
from carpool.core.jobs import Admitted
from carpool.core.script_args import keys_of
from carpool.core.shards import shard, shard_of_job

#: One job's place in an admission's answer: queued, refused (``BinFull`` covers
#: ``WaitTooLong`` and ``OverShare``; ``ModelUnloaded``: the repository API), or
#: unknown/not sent when Redis was lost midway.
AdmitOutcome = Admitted | Refused | BackendUnavailable


@dataclass(frozen=True)
class AdmitJob:
    """One job to queue: its bin, its id (``carpool.core.jobs.new_job_id``), its input."""

    bin: BinSpec
    id: str
    input_json: str


@dataclass(frozen=True)
class AdmitRequest:
    """Jobs of one model and what they share (the web's options for one submission)."""

    model: ModelSpec
    jobs: tuple[AdmitJob, ...]
    queued_ttl_s: int
    deadline_ms: int = 0  # 0: the model's default deadline
    priority: int = 0
    owner: str = ""
    owner_weight: float = 1.0  # the owner's fair-share weight (the keys file)
    #: With an idempotency key (one job only): a repeat answers the first job.
    idempotency_digest: str | None = None
    input_digest: str = ""  # the input's digest, told apart under one idempotency key
    #: The webhook asked for, as the record keeps it (carpool/core/webhooks.py); "" none.
    hook: str = ""
    #: The service tier it runs in (carpool/admission/tiers.py).
    tier: str = DEFAULT_TIER


#: What one-job requests must share to go in one admit.lua call: the model and bin
#: (the script's keys) and the options (its per-call arguments).
_CoalesceKey = tuple[str, str, int, int, int, str, float, str, str]
#: Calls' fixed KEYS and ARGV kept per bin and options (``Admissions._head``): one per
#: model, bin and owner in use; past this many, all are dropped and built again.
HEADS_KEPT = 1024


class Admissions:
    """Admit jobs: ``admit`` is the only entry point (docs/admission.md)."""

    def __init__(self, client: redis.Redis, keys: Keys, *, coalesce: bool = False,
                 policies: Mapping[str, KeyPolicy] | None = None) -> None:
        self.client = client
        self.keys = keys
        #: Each key's quotas (the keys file), by owner digest: admit.lua checks them.
        self.policies: Mapping[str, KeyPolicy] = policies or {}
        #: Each tier's share of a bin's bound: some reserve capacity for priority keys.
        self.tier_shares = tier_shares(any(p.tier == "priority" for p in self.policies.values()))
        self._admit = load_script(client, "admit")
        self._heads: dict[_CoalesceKey, tuple[ModelSpec, BinSpec, list[bytes], list[bytes]]] = {}
        self.calls: Coalescer[_CoalesceKey, AdmitRequest, AdmitOutcome] | None = (
            Coalescer(lambda _, requests: self._uncoalesced(_merged(requests)))
            if coalesce else None)

    def admit(self, request: AdmitRequest) -> list[AdmitOutcome]:
        """Queue ``request.jobs``; one outcome per job, in order.

        One admit.lua call per bin admits that bin's jobs, in order, up to its bound
        (checked atomically): ``BinFull`` at the depth bound, ``WaitTooLong`` when a job
        would start after its deadline (else max_queue_ms), ``OverShare`` near the bound
        when the owner is over its weight's share, ``BudgetFull`` past the model's (or
        key's) byte budget. With an owner, jobs sort behind that owner's backlog by its
        virtual clock (fair queueing); where a job sorts in its bin follows from its
        deadline and priority (carpool.admission.urgency).

        When Redis is lost after an earlier bin's call went through, the failed call's
        jobs hold ``BackendUnavailable`` (sent: may run on resume), later ones
        ``NotSent``. Raises ``BackendUnavailable`` when the first call failed (its jobs
        may run), ``IdempotencyConflict`` when the idempotency key was used for another
        input.
        """
        if self.calls is not None and len(request.jobs) == 1 and not request.idempotency_digest:
            job = request.jobs[0]
            key = (request.model.name, job.bin.name, request.queued_ttl_s, request.deadline_ms,
                   request.priority, request.owner, request.owner_weight, request.hook,
                   request.tier)
            try:
                return [self.calls.call(key, request)]
            except (BinFull, BudgetFull, ModelUnloaded) as refused:  # this job's own answer
                return [refused]
        return self._uncoalesced(request)

    def _uncoalesced(self, request: AdmitRequest) -> list[AdmitOutcome]:
        if request.idempotency_digest and len(request.jobs) != 1:
            raise ValueError("an idempotency key admits one job")
        model, jobs = request.model, request.jobs
        by_bin: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_bin.setdefault(job.bin.name, []).append(i)
        out: list[AdmitOutcome | None] = [None] * len(jobs)
        for positions in by_bin.values():
            bin_spec = jobs[positions[0]].bin
            ids = [jobs[i].id for i in positions]
            keys, args = self._call(request, bin_spec, [jobs[i] for i in positions])
            try:
                with redis_errors():
                    reply = self._admit(keys=keys, args=args)
            except BackendUnavailable as exc:  # this call may still run once Redis resumes
                if all(o is None for o in out):
                    raise
                not_sent = NotSent(f"{exc}; not queued (not sent to Redis)")
                out = [exc if i in positions else not_sent if o is None else o
                       for i, o in enumerate(out)]
                break
            for i, outcome in zip(positions, _outcomes(model, bin_spec, ids, reply),
                                  strict=True):
                out[i] = outcome
        return [o for o in out if o is not None]

    def _call(self, request: AdmitRequest, bin_spec: BinSpec, jobs: Sequence[AdmitJob],
              ) -> tuple[list[bytes], list[bytes]]:
        """admit.lua's KEYS and ARGV for ``jobs`` of one bin, encoded as Redis reads them:
        redis-py checks and encodes every argument (~1 µs each; a call has ~40) unless
        it is bytes already."""
        tag = shard(request.model.name)
        for job in jobs:
            if shard_of_job(job.id) != tag:  # its record would land on another shard
                raise ValueError(f"job id {job.id!r} is not one of model {request.model.name!r}: "
                                 "make it with carpool.core.jobs.new_job_id(model)")
        keys, head = self._head(request, bin_spec)
        return keys, head + [v.encode() for job in jobs for v in (job.id, job.input_json)]

    def _head(self, request: AdmitRequest, bin_spec: BinSpec) -> tuple[list[bytes], list[bytes]]:
        """admit.lua's KEYS and the ARGV before the jobs: the same for every call of one
        bin with the same options, so kept (building them cost ~50 µs, a tenth of a
        submit's CPU). An idempotent call's are its own, and never kept."""
        if request.idempotency_digest:
            return self._build_head(request, bin_spec)
        key = (request.model.name, bin_spec.name, request.queued_ttl_s, request.deadline_ms,
               request.priority, request.owner, request.owner_weight, request.hook, request.tier)
        kept = self._heads.get(key)
        # The same specs, not just their names: a catalogue reloaded in tests is new.
        if kept is not None and kept[0] is request.model and kept[1] is bin_spec:
            return kept[2], kept[3]
        keys, head = self._build_head(request, bin_spec)
        if len(self._heads) >= HEADS_KEPT:  # many owners: start over rather than grow
            self._heads.clear()
        self._heads[key] = (request.model, bin_spec, keys, head)
        return keys, head

    def _build_head(self, request: AdmitRequest, bin_spec: BinSpec,
                    ) -> tuple[list[bytes], list[bytes]]:
        model, idempotent = request.model, bool(request.idempotency_digest)
        keys = keys_of(
            AdmitArgs, bin=self.keys.bin(model.name, bin_spec.name),
            wake=self.keys.wake(model.name),
            idem=self.keys.idempotency(model.name, request.idempotency_digest or "-"),
            stats=self.keys.stats(model.name, bin_spec.name),
            tenants=self.keys.tenants(model.name, bin_spec.name),
            bytes=self.keys.queued_bytes(model.name),
            owner_bytes=self.keys.owner_queued_bytes(model.name, request.owner or "-"),
            model_stats=self.keys.model_stats(model.name),
            # Their jobs that sort ahead of this one run first: one worker serves
            # every bin of its model (admit.lua's predicted wait), each bin's weighing
            # what it costs (its stats hash follows its zset).
            other_bins=[key for b in model.bins if b.name != bin_spec.name
                        for key in (self.keys.bin(model.name, b.name),
                                    self.keys.stats(model.name, b.name))])
        deadline_ms = effective_deadline_ms(model, request.deadline_ms)
        # The owner's quotas: one per owner, so a head kept per owner keeps them.
        policy = self.policies.get(request.owner) if request.owner else None
        head = AdmitArgs(
            job_prefix=self.keys.job_prefix(shard(model.name)), model=model.name,
            bin=bin_spec.name, max_depth=bin_spec.max_depth, max_batch=bin_spec.max_batch,
            queued_ttl_s=request.queued_ttl_s, idempotent=idempotent,
            wake_cap=WAKE_LIST_CAP, drain_tau_ms=DRAIN_TAU_MS, deadline_ms=deadline_ms,
            priority=request.priority,
            sort_offset_ms=sort_offset_ms(model, deadline_ms, request.priority),
            owner=request.owner, input_digest=request.input_digest if idempotent else "",
            max_queue_ms=model.max_queue_ms_of(bin_spec), drain_min_age_ms=DRAIN_MIN_AGE_MS,
            drain_stale_ms=DRAIN_STALE_MS, owner_weight=request.owner_weight,
            fair_share_near=FAIR_SHARE_NEAR,
            fair_lead_cap_ms=fair_lead_cap_ms(model.max_queue_ms_of(bin_spec)),
            max_queued_bytes=model.max_queued_bytes, key_queued_bytes=model.key_queued_bytes,
            admitted_channel=self.keys.admitted_channel, hook=request.hook,
            usage_prefix=self.keys.usage_prefix(model.name), usage_ttl_s=USAGE_KEEP_S,
            quota_device_ms_per_hour=round(policy.quota_device_s_per_hour * 1000) if policy else 0,
            quota_jobs_per_s=policy.quota_jobs_per_s if policy else 0.0,
            tier_share=self.tier_shares[request.tier], tier=request.tier)
        return [key.encode() for key in keys], [str(v).encode() for v in head.argv(())]


def _merged(requests: list[AdmitRequest]) -> AdmitRequest:
    """Coalesced one-job requests (equal but for their job) as one request."""
    return replace(requests[0], jobs=tuple(job for r in requests for job in r.jobs))


def _outcomes(model: ModelSpec, bin_spec: BinSpec, ids: list[str], reply: Sequence[Any]
              ) -> list[Admitted | Refused]:
    """admit.lua's reply per job; an idempotent call's (one job) may name the first job."""
    if reply[0] == "dup":
        return [Admitted(str(reply[1]), model.name, bin_spec.name, 0, duplicate=True)]
    if reply[0] == "conflict":  # never name the first job: without API keys, ids are secrets
        raise IdempotencyConflict(
            "this idempotency key was already used for a different input (of this model); "
            "use a new key for a new input"
        )
    return admit_outcomes(model, bin_spec, ids, reply)


def single_admitted(outcomes: Sequence[AdmitOutcome]) -> Admitted:
    """A one-job admission's ``Admitted``; raises its refusal (``BinFull``, ...)."""
    (outcome,) = outcomes
    if not isinstance(outcome, Admitted):
        raise outcome
    return outcome
