"""The Redis queue protocol: one typed method per Lua script.

Every call goes through ``carpool.backend.connection.redis_errors``, so a Redis error
becomes ``BackendUnavailable``: the web answers 503 and the worker backs off,
without either knowing redis-py's exception tree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from carpool.admission.admit_args import AdmitArgs
from carpool.admission.admit_reply import admit_outcomes
from carpool.admission.retry_after import (
    DRAIN_MIN_AGE_MS,
    DRAIN_STALE_MS,
    DRAIN_TAU_MS,
    FAIR_SHARE_NEAR,
    fair_lead_cap_ms,
)
from carpool.admission.urgency import effective_deadline_ms, sort_offset_ms
from carpool.backend import records
from carpool.backend.args import CancelArgs, ClaimArgs, CompleteArgs, PeekArgs, ReadArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.replies import Completed, bin_states, claim_reply, completion_args
from carpool.backend.wake import ShardWaiters
from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import (
    BackendUnavailable,
    BinFull,
    BudgetFull,
    IdempotencyConflict,
    NotCancellable,
    NotSent,
)
from carpool.core.jobs import (
    Admitted,
    BinState,
    Claim,
    JobView,
    Outcome,
    view_from_hash,
)
from carpool.core.script_args import Arg, argv, keys_of
from carpool.core.settings import QUEUED_TTL_S_DEFAULT
from carpool.core.shards import shard, shard_of_job

#: Tokens kept in a wake list; more would only cause extra, harmless peeks.
WAKE_LIST_CAP = 16
#: One claim takes at most this many times max_n ids off a bin, expired ones
#: included, so a backlog of expired jobs is cleared in bounded slices.
CLAIM_SCAN_FACTOR = 4


@dataclass(frozen=True)
class AdmitRequest:
    """What every job of one submission shares (the web's options for it)."""

    queued_ttl_s: int
    deadline_ms: int = 0  # 0: the model's default deadline
    priority: int = 0
    owner: str = ""
    owner_weight: float = 1.0  # the owner's fair-share weight (the keys file)


def ended_ids(message: str) -> list[str]:
    """The job ids of one message on the done channel (one batch's, space-separated), or
    on the admitted channel (one admit.lua call's, the same way)."""
    return message.split()


class Queue:
    """Admit, peek, claim, complete and cancel jobs; each is one Lua script call."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._admit = load_script(client, "admit")
        self._peek = load_script(client, "peek")
        self._claim = load_script(client, "claim")
        self._complete = load_script(client, "complete")
        self._cancel = load_script(client, "cancel")
        self._read = load_script(client, "read")
        self._waiters: ShardWaiters | None = None  # on a cluster, for several shards

    def admit(
        self, model: ModelSpec, bin_spec: BinSpec, job_id: str, input_json: str, *,
        queued_ttl_s: int, deadline_ms: int = 0, priority: int = 0,
        idempotency_digest: str | None = None, input_digest: str = "", owner: str = "",
        owner_weight: float = 1.0,
    ) -> Admitted:
        """Queue one job; raises ``BinFull`` at the bin's bound (checked atomically), and
        ``WaitTooLong`` when it would start after its deadline (else max_queue_ms), and
        ``OverShare`` near the bound when ``owner`` is over its ``owner_weight``'s share,
        and ``BudgetFull`` when the input would pass the model's (or key's) byte budget.
        With an ``owner``, the job sorts behind that owner's backlog by its virtual clock
        (fair queueing between owners: docs/admission.md).

        ``deadline_ms`` 0 takes the model's default deadline; where the job sorts in
        its bin follows from its deadline and priority (carpool.admission.urgency).
        """
        request = AdmitRequest(queued_ttl_s, deadline_ms, priority, owner, owner_weight)
        call = self._admit_call(model, bin_spec, [(job_id, input_json)], request,
                                idempotency_digest, input_digest)
        with redis_errors():
            reply = self._admit(keys=call[0], args=call[1])
        kind = reply[0]
        if kind == "dup":
            return Admitted(str(reply[1]), model.name, bin_spec.name, 0, duplicate=True)
        if kind == "conflict":  # never name the first job: without API keys, ids are secrets
            raise IdempotencyConflict(
                "this idempotency key was already used for a different input (of this model); "
                "use a new key for a new input"
            )
        outcome = admit_outcomes(model, bin_spec, [job_id], reply)[0]
        if isinstance(outcome, BinFull | BudgetFull):
            raise outcome
        return outcome

    def admit_many(
        self, model: ModelSpec, jobs: Sequence[tuple[BinSpec, str, str]], request: AdmitRequest
    ) -> list[Admitted | BinFull | BudgetFull | BackendUnavailable]:
        """Queue many jobs of one model, ``(bin, id, input JSON)`` each.

        One admit.lua call per bin admits that bin's jobs, in order, up to its bound:
        one round trip for a batch of one bin. Each job's place in the answer holds
        its ``Admitted``, its ``BinFull`` (``WaitTooLong``, ``OverShare``), ``BudgetFull``,
        or, when Redis was lost after an earlier bin's call went through,
        ``BackendUnavailable`` (its bin's call was sent: may run on resume) or ``NotSent``.
        Raises ``BackendUnavailable`` when the first call failed (its jobs may run).
        """
        by_bin: dict[str, list[int]] = {}
        for i, (bin_spec, _, _) in enumerate(jobs):
            by_bin.setdefault(bin_spec.name, []).append(i)
        out: list[Admitted | BinFull | BudgetFull | BackendUnavailable | None] = (
            [None] * len(jobs))
        for positions in by_bin.values():
            bin_spec = jobs[positions[0]][0]
            ids = [jobs[i][1] for i in positions]
            keys, args = self._admit_call(model, bin_spec, [(jobs[i][1], jobs[i][2])
                                                            for i in positions], request)
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
            for i, outcome in zip(positions, admit_outcomes(model, bin_spec, ids, reply),
                                  strict=True):
                out[i] = outcome
        return [o for o in out if o is not None]

    def _admit_call(
        self, model: ModelSpec, bin_spec: BinSpec, jobs: Sequence[tuple[str, str]],
        request: AdmitRequest, idempotency_digest: str | None = None, input_digest: str = "",
    ) -> tuple[list[str], list[str | int]]:
        """admit.lua's KEYS and ARGV for ``jobs`` (id, input JSON) of one bin."""
        idem_key = self.keys.idempotency(model.name, idempotency_digest or "-")
        keys = [self.keys.bin(model.name, bin_spec.name), self.keys.wake(model.name),
                idem_key, self.keys.stats(model.name, bin_spec.name),
                self.keys.tenants(model.name, bin_spec.name),
                self.keys.queued_bytes(model.name),
                self.keys.owner_queued_bytes(model.name, request.owner or "-")]
        deadline_ms = effective_deadline_ms(model, request.deadline_ms)
        tag = shard(model.name)
        head = AdmitArgs(
            job_prefix=self.keys.job_prefix(tag), model=model.name, bin=bin_spec.name,
            max_depth=bin_spec.max_depth, max_batch=bin_spec.max_batch,
            queued_ttl_s=request.queued_ttl_s, idempotent=bool(idempotency_digest),
            wake_cap=WAKE_LIST_CAP, drain_tau_ms=DRAIN_TAU_MS, deadline_ms=deadline_ms,
            priority=request.priority,
            sort_offset_ms=sort_offset_ms(model, deadline_ms, request.priority),
            owner=request.owner, input_digest=input_digest if idempotency_digest else "",
            max_queue_ms=model.max_queue_ms_of(bin_spec), drain_min_age_ms=DRAIN_MIN_AGE_MS,
            drain_stale_ms=DRAIN_STALE_MS, owner_weight=request.owner_weight,
            fair_share_near=FAIR_SHARE_NEAR,
            fair_lead_cap_ms=fair_lead_cap_ms(model.max_queue_ms_of(bin_spec)),
            max_queued_bytes=model.max_queued_bytes, key_queued_bytes=model.key_queued_bytes,
            admitted_channel=self.keys.admitted_channel)
        for job_id, _ in jobs:
            if shard_of_job(job_id) != tag:  # its record would land on another shard
                raise ValueError(f"job id {job_id!r} is not one of model {model.name!r}: "
                                 "make it with carpool.core.jobs.new_job_id(model)")
        return keys, head.argv(jobs)

    def peek(
        self, bins: Sequence[tuple[str, str]], scan: Sequence[int] | None = None
    ) -> tuple[int, list[BinState]]:
        """Redis time (ms) and each (model, bin)'s state (``BinState`` says over which jobs).

        ``scan`` is each bin's max_batch as the worker holds it now (default 1: the head).
        """
        scan = [1] * len(bins) if scan is None else scan
        by_model: dict[str, list[int]] = {}
        for i, (model, _) in enumerate(bins):
            by_model.setdefault(model, []).append(i)
        now_ms = 0
        states: list[BinState | None] = [None] * len(bins)
        for model, positions in by_model.items():  # a script touches one shard's keys only
            names = [bins[i][1] for i in positions]
            keys = keys_of(PeekArgs, bins=[self.keys.bin(model, b) for b in names],
                           stats=[self.keys.stats(model, b) for b in names])
            with redis_errors():
                reply = self._peek(keys=keys, args=argv(PeekArgs(self.keys.job_prefix(
                    shard(model))), (scan[i] for i in positions)))
            now_ms = max(now_ms, int(reply[0]))
            for i, state in zip(positions, bin_states(model, names, reply[1:]), strict=True):
                states[i] = state
        return now_ms, [st for st in states if st is not None]

    def claim(
        self, model: ModelSpec, bin_name: str, max_n: int, *, lease_ms: int, token: str,
        worker: str, queued_ttl_s: int = QUEUED_TTL_S_DEFAULT,
    ) -> Claim:
        """Lease up to ``max_n`` of the bin's most urgent live jobs to ``token``.

        Jobs whose deadline passed, or queued longer than ``queued_ttl_s``, end "expired"
        instead (``Claim.expired`` counts them)."""
        tag = shard(model.name)
        keys = keys_of(ClaimArgs, bin=self.keys.bin(model.name, bin_name),
                       leases=self.keys.leases(tag), bytes=self.keys.queued_bytes(model.name),
                       claim=self.keys.claim(tag, token))
        args = ClaimArgs(max_n, lease_ms, token, self.keys.job_prefix(tag), worker,
                         self.keys.done_channel, model.result_ttl_s,
                         max_n * CLAIM_SCAN_FACTOR, queued_ttl_s)
        with redis_errors():
            reply = self._claim(keys=keys, args=argv(args))
        return claim_reply(model.name, bin_name, token, reply)

    def complete(
        self, model: ModelSpec, claim: Claim, outcomes: Sequence[Outcome],
        batch: dict[str, Any], peek: Sequence[str] = (), scan: Sequence[int] = (),
    ) -> Completed:
        """Write each outcome once (``Completed.written``: False where the lease was lost,
        the write refused); and then, in the same script call, the state of the model's
        bins named in ``peek`` (``scan``: each one's max_batch, as for ``peek``): what the
        worker decides its next batch from, without a round trip of its own."""
        if len(scan) != len(peek):
            raise ValueError(f"one max_batch per bin peeked: {len(peek)} bins, "
                             f"{len(scan)} given")
        tag = shard(model.name)
        batch_json = json.dumps(batch)
        per_job, pushed = completion_args(model.name, claim, outcomes, batch_json)
        args = CompleteArgs(claim.token, self.keys.job_prefix(tag), self.keys.done_channel,
                            model.result_ttl_s, batch_json, DRAIN_TAU_MS,
                            self.keys.results_channel, pushed, len(outcomes))
        keys = keys_of(CompleteArgs, leases=self.keys.leases(tag),
                       stats=self.keys.stats(model.name, claim.bin),
                       claim=self.keys.claim(tag, claim.token),
                       bins=[self.keys.bin(model.name, b) for b in peek],
                       bin_stats=[self.keys.stats(model.name, b) for b in peek])
        with redis_errors():
            reply = self._complete(keys=keys, args=argv(args, per_job, scan))
        n = len(outcomes)
        written = [bool(x) for x in reply[:n]]
        if not peek:
            return Completed(written)
        return Completed(written, int(reply[n]), bin_states(model.name, peek, reply[n + 1:]))

    def cancel(self, job_id: str, result_ttl_s: int) -> str:
        """"cancelled" or "deleted"; raises ``NotCancellable`` while it runs; "missing"."""
        tag = shard_of_job(job_id)
        args = CancelArgs(job_id, self.keys.bin_prefix(tag), self.keys.done_channel,
                          result_ttl_s, self.keys.bytes_prefix(tag), self.keys.results_channel)
        with redis_errors():
            reply = str(self._cancel(keys=keys_of(CancelArgs, job=self.keys.job(job_id)),
                                     args=argv(args)))
        if reply == "running":
            raise NotCancellable(f"job {job_id} is running and can no longer be cancelled")
        return reply

    def get(self, job_id: str) -> JobView | None:
        """The job as a client sees it; None when it does not exist (or expired)."""
        return self.get_many([job_id])[0]

    def get_many(self, job_ids: Sequence[str]) -> list[JobView | None]:
        """Several jobs in one round trip (``read.lua``, one call per shard), never
        their inputs, which may be large; a claimed job reads as running."""
        return [view_from_hash(job_id, h) if h and "status" in h else None
                for job_id, h in zip(job_ids, self.read_records(job_ids), strict=True)]

    def read_records(self, job_ids: Sequence[str]) -> list[dict[str, str] | None]:
        """The jobs' records, parsed (carpool/backend/records.py) as a client reads them: a
        queued record without its input, and with status "running" when a claim holds
        its job; None where there is none."""
        by_shard: dict[str, list[int]] = {}
        for i, job_id in enumerate(job_ids):
            by_shard.setdefault(shard_of_job(job_id), []).append(i)
        calls = [(keys_of(ReadArgs, jobs=[self.keys.job(job_ids[i]) for i in idx]),
                  argv(ReadArgs(self.keys.bin_prefix(tag), self.keys.job_prefix(tag))))
                 for tag, idx in by_shard.items()]
        with redis_errors():
            replies = self._read_calls(calls)
        out: list[dict[str, str] | None] = [None] * len(job_ids)
        for idx, reply in zip(by_shard.values(), replies, strict=True):
            for i, row in zip(idx, reply, strict=True):
                out[i] = records.parse(str(row)) if row is not None else None
        return out

    def _read_calls(self, calls: list[tuple[list[str], list[Arg]]]) -> list[Any]:
        """``read.lua`` once per (keys, args): one call alone; several (jobs of several
        shards) in one pipelined round trip, except on a cluster, where each goes to
        its own shard's master."""
        if len(calls) == 1 or isinstance(self.client, RedisCluster):
            return [self._read(keys=keys, args=args) for keys, args in calls]
        try:
            return self._pipelined_reads(calls)
        except NoScriptError:  # Redis restarted or flushed its scripts: load it, once
            self._read.sha = self.client.script_load(self._read.script)
            return self._pipelined_reads(calls)

    def _pipelined_reads(self, calls: list[tuple[list[str], list[Arg]]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(self._read.sha, len(keys), *keys, *args)
        return list(pipe.execute())

    def depths(self, bins: Sequence[tuple[str, str]]) -> list[int]:
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model, bin_name in bins:
                pipe.zcard(self.keys.bin(model, bin_name))
            return [int(x) for x in pipe.execute()]

    def wait_for_work(self, models: Sequence[str], timeout_s: float) -> bool:
        """Block until a wake token arrives for one of ``models``, or ``timeout_s`` passes.

        One BLPOP names every wake list, except on a cluster, where a command may not
        span slots: there each model's list has a thread of its own (carpool.backend.wake).
        """
        wake_keys = [self.keys.wake(m) for m in models]
        if isinstance(self.client, RedisCluster) and len(wake_keys) > 1:
            if self._waiters is None or self._waiters.wake_keys != tuple(wake_keys):
                if self._waiters is not None:
                    self._waiters.close()
                self._waiters = ShardWaiters(self.client, wake_keys)
            return self._waiters.wait(timeout_s)
        with redis_errors():
            got = self.client.blpop(wake_keys, timeout=timeout_s)
        return got is not None

    def ping(self) -> None:
        with redis_errors():
            self.client.ping()
