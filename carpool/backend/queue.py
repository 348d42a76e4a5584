"""The Redis queue protocol: one typed method per Lua script.

Every call goes through ``carpool.backend.connection.redis_errors``, so a Redis error
becomes ``BackendUnavailable``: the web answers 503 and the worker backs off,
without either knowing redis-py's exception tree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from carpool.admission.retry_after import DRAIN_TAU_MS
from carpool.admission.tiers import TIERS
from carpool.backend import records
from carpool.backend.args import CancelArgs, ClaimArgs, CompleteArgs, PeekArgs, ReadArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.outbox import Outbox, webhook_doc
from carpool.backend.replies import (
    Completed,
    bin_states,
    claim_reply,
    completion_args,
    started_late,
)
from carpool.backend.usage import TIER_REFUSED_FIELD, USAGE_KEEP_S
from carpool.backend.wake import ShardWaiters
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import (
    NotCancellable,
)
from carpool.core.jobs import (
    BinState,
    Claim,
    JobView,
    Outcome,
    view_from_record,
)
from carpool.core.script_args import Arg, argv, keys_of
from carpool.core.settings import QUEUED_TTL_S_DEFAULT
from carpool.core.shards import shard, shard_of_job
from carpool.scheduling.batching import Cost

#: Tokens kept in a wake list; more would only cause extra, harmless peeks.
WAKE_LIST_CAP = 16
#: One claim takes at most this many times max_n ids off a bin, expired ones
#: included, so a backlog of expired jobs is cleared in bounded slices.
CLAIM_SCAN_FACTOR = 4


def ended_ids(message: str) -> list[str]:
    """The job ids of one message on the done channel (one batch's, space-separated), or
    on the admitted channel (one admit.lua call's, the same way)."""
    return message.split()


class Queue:
    """Peek, claim, complete and cancel jobs; each is one Lua script call. Admission is
    carpool/backend/admissions.py's."""

    def __init__(self, client: redis.Redis, keys: Keys,
                 versions: Mapping[str, str] | None = None) -> None:
        self.client = client
        self.keys = keys
        #: Each catalogue name's version (carpool.core.versions.version_map), which the
        #: documents of a model's own entry's jobs show; without it, "1".
        self.versions = versions or {}
        self._peek = load_script(client, "peek")
        self._claim = load_script(client, "claim")
        self._complete = load_script(client, "complete")
        self._cancel = load_script(client, "cancel")
        self._read = load_script(client, "read")
        self._waiters: ShardWaiters | None = None  # on a cluster, for several shards
        self._outbox: Outbox | None = None  # read when a job with a webhook is

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
        worker: str, queued_ttl_s: int = QUEUED_TTL_S_DEFAULT, cost: Cost | None = None,
    ) -> Claim:
        """Lease up to ``max_n`` of the bin's most urgent live jobs to ``token``.

        Jobs whose deadline passed, or comes before their batch would end (``cost``:
        the bin's fitted batch time; None: unknown), or queued longer than
        ``queued_ttl_s``, end "expired" instead (``Claim.expired`` counts them)."""
        tag = shard(model.name)
        keys = keys_of(ClaimArgs, bin=self.keys.bin(model.name, bin_name),
                       leases=self.keys.leases(tag), bytes=self.keys.queued_bytes(model.name),
                       claim=self.keys.claim(tag, token), outbox=self.keys.outbox(tag),
                       hook_wake=self.keys.hook_wake(tag))
        args = ClaimArgs(max_n, lease_ms, token, self.keys.job_prefix(tag), worker,
                         self.keys.done_channel, model.result_ttl_s,
                         max_n * CLAIM_SCAN_FACTOR, queued_ttl_s, self.keys.claimed_channel,
                         cost.a_ms if cost else 0.0, cost.b_ms if cost else 0.0)
        with redis_errors():
            reply = self._claim(keys=keys, args=argv(args))
        return claim_reply(model.name, bin_name, token, reply)

    def complete(
        self, model: ModelSpec, claim: Claim, outcomes: Sequence[Outcome],
        batch: dict[str, Any], peek: Sequence[str] = (), scan: Sequence[int] = (),
        ran_ms: int = 0, busy_ms: int = 0,
    ) -> Completed:
        """Write each outcome once (``Completed.written``: False where the lease was lost,
        the write refused); and then, in the same script call, the state of the model's
        bins named in ``peek`` (``scan``: each one's max_batch, as for ``peek``): what the
        worker decides its next batch from, without a round trip of its own.
        ``busy_ms``: how long the batch kept its worker busy, not counting its overlap
        with the batch before it (0: claim to completion), for the model's pace."""
        if len(scan) != len(peek):
            raise ValueError(f"one max_batch per bin peeked: {len(peek)} bins, "
                             f"{len(scan)} given")
        tag = shard(model.name)
        batch_json = json.dumps(batch)
        per_job, pushed, hooks, usage = completion_args(model.name, claim, outcomes,
                                                        batch_json)
        args = CompleteArgs(claim.token, self.keys.job_prefix(tag), self.keys.done_channel,
                            model.result_ttl_s, batch_json, DRAIN_TAU_MS,
                            self.keys.results_channel, pushed, len(outcomes),
                            started_late(claim, model.max_queue_ms_of(model.bin_named(claim.bin)),
                                         ran_ms), hooks, self.keys.usage_prefix(model.name),
                            USAGE_KEEP_S, usage, busy_ms)
        keys = keys_of(CompleteArgs, leases=self.keys.leases(tag),
                       stats=self.keys.stats(model.name, claim.bin),
                       claim=self.keys.claim(tag, claim.token),
                       model_stats=self.keys.model_stats(model.name),
                       outbox=self.keys.outbox(tag), hook_wake=self.keys.hook_wake(tag),
                       bins=[self.keys.bin(model.name, b) for b in peek],
                       bin_stats=[self.keys.stats(model.name, b) for b in peek])
        with redis_errors():
            reply = self._complete(keys=keys, args=argv(args, per_job, scan))
        n = len(outcomes)
        written = [bool(x) for x in reply[:n]]
        if not peek:
            return Completed(written)
        return Completed(written, int(reply[n]), bin_states(model.name, peek, reply[n + 1:]))

    def cancel(self, job_id: str, result_ttl_s: int, notify: bool = True) -> str:
        """"cancelled" or "deleted"; raises ``NotCancellable`` while it runs; "missing".
        ``notify=False``: no "cancelled" webhook, for a cancel that undoes an admission."""
        tag = shard_of_job(job_id)
        args = CancelArgs(job_id, self.keys.bin_prefix(tag), self.keys.done_channel,
                          result_ttl_s, self.keys.bytes_prefix(tag), self.keys.results_channel,
                          int(notify))
        keys = keys_of(CancelArgs, job=self.keys.job(job_id), outbox=self.keys.outbox(tag),
                       hook_wake=self.keys.hook_wake(tag))
        with redis_errors():
            reply = str(self._cancel(keys=keys, args=argv(args)))
        if reply == "running":
            raise NotCancellable(f"job {job_id} is running and can no longer be cancelled")
        return reply

    def cancel_queued(self, job_id: str, result_ttl_s: int, reason: str) -> str:
        """Cancel the job only if it is still queued, its error ``reason``: "cancelled";
        else nothing changes: "running", "ended" or "missing". Atomic (cancel.lua), so a
        job a worker claimed meanwhile is never touched."""
        tag = shard_of_job(job_id)
        args = CancelArgs(job_id, self.keys.bin_prefix(tag), self.keys.done_channel,
                          result_ttl_s, self.keys.bytes_prefix(tag), self.keys.results_channel,
                          1, queued_only=1, reason=reason)
        keys = keys_of(CancelArgs, job=self.keys.job(job_id), outbox=self.keys.outbox(tag),
                       hook_wake=self.keys.hook_wake(tag))
        with redis_errors():
            return str(self._cancel(keys=keys, args=argv(args)))

    def get(self, job_id: str) -> JobView | None:
        """The job as a client sees it; None when it does not exist (or expired)."""
        return self.get_many([job_id])[0]

    def get_many(self, job_ids: Sequence[str]) -> list[JobView | None]:
        """Several jobs in one round trip (``read.lua``, one call per shard), never
        their inputs, which may be large; a claimed job reads as running."""
        views = [view_from_record(job_id, h, self.versions) if h and "status" in h else None
                 for job_id, h in zip(job_ids, self.read_records(job_ids), strict=True)]
        return self._with_webhooks(views)

    def _with_webhooks(self, views: list[JobView | None]) -> list[JobView | None]:
        """``views`` with the delivery state of those that asked for a webhook: one more
        round trip, only when some did."""
        hooked = [(i, v) for i, v in enumerate(views) if v is not None and v.webhook is not None]
        if not hooked:
            return views
        if self._outbox is None:
            self._outbox = Outbox(self.client, self.keys)
        found = self._outbox.deliveries([v.id for _, v in hooked])
        for (i, view), deliveries in zip(hooked, found, strict=True):
            views[i] = replace(view, webhook=webhook_doc(deliveries))
        return views

    def read_records(self, job_ids: Sequence[str]) -> list[dict[str, str] | None]:
        """The jobs' records, parsed (carpool/backend/records.py) as a client reads them: a
        queued record without its input but with its ``position`` in its bin, and with
        status "running" when a claim holds its job; None where there is none."""
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
                out[i] = records.parse_read(str(row)) if row is not None else None
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

    def depths_and_refused(self, bins: Sequence[tuple[str, str]], models: Sequence[str],
                           ) -> tuple[list[int], list[dict[str, int]]]:
        """Each bin's depth and each model's jobs refused at admission by service tier
        (admit.lua counts them in the model's stats hash since it began), in one round
        trip: ``GET /models``."""
        fields = [f"{TIER_REFUSED_FIELD}{tier}" for tier in TIERS]
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model, bin_name in bins:
                pipe.zcard(self.keys.bin(model, bin_name))
            for model in models:
                pipe.hmget(self.keys.model_stats(model), fields)
            found = pipe.execute()
        refused = [{tier: int(n or 0) for tier, n in zip(TIERS, row, strict=True)}
                   for row in found[len(bins):]]
        return [int(x) for x in found[:len(bins)]], refused

    def drained(self, bins: Sequence[tuple[str, str]]) -> list[int]:
        """Jobs each bin's workers have written (done or failed) since its stats began."""
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model, bin_name in bins:
                pipe.hget(self.keys.stats(model, bin_name), "drained")
            return [int(x or 0) for x in pipe.execute()]

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
