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

from carpool.admission.retry_after import DRAIN_TAU_MS
from carpool.backend import records
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.pushed import job_blob
from carpool.backend.wake import ShardWaiters
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import NotCancellable
from carpool.core.jobs import (
    BinState,
    Claim,
    ClaimedJob,
    JobView,
    Outcome,
    view_from_record,
)
from carpool.core.settings import QUEUED_TTL_S_DEFAULT
from carpool.core.shards import shard, shard_of_job

#: Tokens kept in a wake list; more would only cause extra, harmless peeks.
WAKE_LIST_CAP = 16
#: One claim takes at most this many times max_n ids off a bin, expired ones
#: included, so a backlog of expired jobs is cleared in bounded slices.
CLAIM_SCAN_FACTOR = 4


@dataclass(frozen=True)
class ClaimAhead:
    """A worker's request to claim its next batch in the same script call as a peek or
    a completion of the bins it serves (``carpool/backend/lua/claim_batch.lua``): under
    ``token``, up to ``max_n[i]`` jobs of the i-th bin peeked (0: never that bin), and
    only when that is the batch the worker's own decision is sure to take."""

    token: str
    lease_ms: int
    worker: str
    queued_ttl_s: int
    max_n: tuple[int, ...]


@dataclass(frozen=True)
class Completed:
    """What ``complete_and_peek`` answers: per job, written or refused; and, when bins
    were peeked, Redis time (ms) and their states, as ``peek`` returns them, and the
    batch claimed ahead when one was asked for and claimed."""

    written: list[bool]
    now_ms: int = 0
    states: list[BinState] | None = None
    ahead: Claim | None = None


def _claimed_job(job_id: str, record: str, now_ms: int) -> ClaimedJob:
    """A job as claim.lua hands it out: its id and its queued record, whole. This claim
    is one more run: claim.lua counted it in the claim hash the same way."""
    attempts, admission, input_json = records.claimed(record)
    t_admit_ms, owner = records.admission_fields(admission)
    return ClaimedJob(job_id, input_json, now_ms if t_admit_ms is None else t_admit_ms,
                      attempts + 1, owner, admission)


def _claim_reply(model: str, bin_name: str, token: str, now_ms: int,
                 reply: Sequence[Any]) -> Claim:
    """claim_batch.lua's answer, ``expired, id, record, id, record, ...``, as a Claim."""
    jobs = tuple(_claimed_job(str(reply[i]), str(reply[i + 1]), now_ms)
                 for i in range(1, len(reply), 2))
    return Claim(model, bin_name, token, now_ms, jobs, expired=int(reply[0]))


def _ahead_claim(model: str, bins: Sequence[str], token: str, now_ms: int,
                 reply: Sequence[Any]) -> Claim | None:
    """claim_ahead's answer (after the bin states): the bin's index, from 1, then a
    claim's answer; or 0 alone when it claimed nothing."""
    if not reply or int(reply[0]) == 0:
        return None
    return _claim_reply(model, bins[int(reply[0]) - 1], token, now_ms, reply[1:])


def _bin_states(model: str, bins: Sequence[str], reply: Sequence[Any]) -> list[BinState]:
    """peek_bins.lua's four numbers per bin, as ``BinState``s."""
    states = []
    for k, bin_name in enumerate(bins):
        depth, oldest, earliest, admitted = (int(x) for x in reply[4 * k: 4 * k + 4])
        states.append(BinState(model, bin_name, depth, oldest if oldest >= 0 else None,
                               earliest if earliest > 0 else None, admitted))
    return states


def ended_ids(message: str) -> list[str]:
    """The job ids of one message on the done channel (one batch's, space-separated), or
    on the admitted channel (one admit.lua call's, the same way)."""
    return message.split()


class Queue:
    """Peek, claim, complete and cancel jobs; each is one Lua script call (admission:
    carpool.backend.admitting)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._peek = load_script(client, "peek")
        self._claim = load_script(client, "claim")
        self._complete = load_script(client, "complete")
        self._cancel = load_script(client, "cancel")
        self._read = load_script(client, "read")
        self._waiters: ShardWaiters | None = None  # on a cluster, for several shards

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
            keys = ([self.keys.bin(model, bins[i][1]) for i in positions]
                    + [self.keys.stats(model, bins[i][1]) for i in positions])
            with redis_errors():
                reply = self._peek(keys=keys, args=[self.keys.job_prefix(shard(model)), "",
                                                    *(scan[i] for i in positions)])
            now_ms = max(now_ms, int(reply[0]))
            for i, state in zip(positions, _bin_states(model, [bins[i][1] for i in positions],
                                                       reply[1:]), strict=True):
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
        keys = [self.keys.bin(model.name, bin_name), self.keys.leases(tag),
                self.keys.queued_bytes(model.name), self.keys.claim(tag, token)]
        args: list[str | int] = [max_n, lease_ms, token, self.keys.job_prefix(tag), worker,
                self.keys.done_channel, model.result_ttl_s, max_n * CLAIM_SCAN_FACTOR,
                queued_ttl_s]
        with redis_errors():
            reply = self._claim(keys=keys, args=args)
        return _claim_reply(model.name, bin_name, token, int(reply[0]), reply[1:])

    def _ahead_args(self, model: ModelSpec, ahead: ClaimAhead | None) -> tuple[str, list[str]]:
        """A request to claim ahead as the scripts take it (claim_batch.lua), and the
        keys it adds after the leases zset: the model's byte budget, its claim hash."""
        if ahead is None:
            return "", []
        request = "\t".join(str(v) for v in (
            ahead.token, ahead.lease_ms, ahead.worker, ahead.queued_ttl_s,
            self.keys.done_channel, model.result_ttl_s, CLAIM_SCAN_FACTOR, *ahead.max_n))
        return request, [self.keys.queued_bytes(model.name),
                         self.keys.claim(shard(model.name), ahead.token)]

    def peek_and_claim(
        self, model: ModelSpec, bins: Sequence[str], scan: Sequence[int], ahead: ClaimAhead,
    ) -> tuple[int, list[BinState], Claim | None]:
        """``peek`` of one model's ``bins`` and, in the same script call, the batch
        ``ahead`` asks for, when it is one the worker's decision is sure to take
        (``ClaimAhead``; the states are those before it)."""
        if not len(bins) == len(scan) == len(ahead.max_n):
            raise ValueError(f"one max_batch and one max_n per bin: {len(bins)} bins, "
                             f"{len(scan)} and {len(ahead.max_n)} given")
        tag = shard(model.name)
        request, more = self._ahead_args(model, ahead)
        keys = [*(self.keys.bin(model.name, b) for b in bins),
                *(self.keys.stats(model.name, b) for b in bins), self.keys.leases(tag), *more]
        with redis_errors():
            reply = self._peek(keys=keys, args=[self.keys.job_prefix(tag), request, *scan])
        now_ms = int(reply[0])
        states = _bin_states(model.name, bins, reply[1:])
        return now_ms, states, _ahead_claim(model.name, bins, ahead.token, now_ms,
                                            reply[1 + 4 * len(bins):])

    def complete(
        self, model: ModelSpec, claim: Claim, outcomes: Sequence[Outcome], batch: dict[str, Any]
    ) -> list[bool]:
        """Write each outcome once; False where the lease was lost (the write is refused)."""
        return self.complete_and_peek(model, claim, outcomes, batch).written

    def complete_and_peek(
        self, model: ModelSpec, claim: Claim, outcomes: Sequence[Outcome],
        batch: dict[str, Any], peek: Sequence[str] = (), scan: Sequence[int] = (),
        ahead: ClaimAhead | None = None,
    ) -> Completed:
        """``complete``, and then, in the same script call, the state of the model's bins
        named in ``peek`` (``scan``: each one's max_batch, as for ``peek``): what the
        worker decides its next batch from, without a round trip of its own; and, with
        ``ahead``, that batch claimed when it is sure (``peek_and_claim``)."""
        if len(scan) != len(peek):  # complete.lua counts bins by KEYS, scans from ARGV's end
            raise ValueError(f"one max_batch per bin peeked: {len(peek)} bins, "
                             f"{len(scan)} given")
        if ahead is not None and len(ahead.max_n) != len(peek):
            raise ValueError(f"one max_n per bin peeked: {len(peek)} bins, "
                             f"{len(ahead.max_n)} given")
        tag = shard(model.name)
        per_job: list[Any] = []
        lines: list[str] = []  # the pushed views, one argument: the script keeps it whole
        claimed = {j.id: j for j in claim.jobs}
        strangers = [o.id for o in outcomes if o.id not in claimed]
        if strangers:  # complete.lua writes a record from what its claim handed out
            raise ValueError(f"outcomes for jobs this claim does not hold: {strangers[:3]}")
        batch_json = json.dumps(batch)
        for o in outcomes:
            timings = json.dumps({"preprocess": round(o.preprocess_ms, 3),
                                  "inference": round(o.inference_ms, 3)})
            payload = (o.error or "") if o.failed else json.dumps(o.result)
            job = claimed[o.id]
            blob = job_blob(job, claim.now_ms, o, payload, timings, model.name)
            if blob:
                lines.append(blob)
            # The ended record, built from what the claim answered (complete.lua adds
            # t_done): the script writes it without reading the queued one.
            head, tail = ("", "")
            if job.admission:
                head, tail = records.ended_parts("failed" if o.failed else "done",
                                                 job.attempts, job.admission, claim.now_ms,
                                                 timings, batch_json, payload)
            per_job += [o.id, len(blob.encode()), head, tail]
        request, more = self._ahead_args(model, ahead if peek else None)
        args: list[Any] = [claim.token, self.keys.job_prefix(tag), self.keys.done_channel,
                           model.result_ttl_s, batch_json, DRAIN_TAU_MS,
                           self.keys.results_channel, "\n".join(lines), request, *per_job,
                           *scan]
        keys = [self.keys.leases(tag), self.keys.stats(model.name, claim.bin),
                self.keys.claim(tag, claim.token),
                *(self.keys.bin(model.name, b) for b in peek),
                *(self.keys.stats(model.name, b) for b in peek), *more]
        with redis_errors():
            reply = self._complete(keys=keys, args=args)
        n = len(outcomes)
        written = [bool(x) for x in reply[:n]]
        if not peek:
            return Completed(written)
        now_ms, at = int(reply[n]), n + 1 + 4 * len(peek)
        ahead_claim = None
        if request and ahead is not None:
            ahead_claim = _ahead_claim(model.name, peek, ahead.token, now_ms, reply[at:])
        return Completed(written, now_ms, _bin_states(model.name, peek, reply[n + 1:at]),
                         ahead_claim)

    def cancel(self, job_id: str, result_ttl_s: int) -> str:
        """"cancelled" or "deleted"; raises ``NotCancellable`` while it runs; "missing"."""
        with redis_errors():
            reply = str(self._cancel(
                keys=[self.keys.job(job_id)],
                args=[job_id, self.keys.bin_prefix(shard_of_job(job_id)),
                      self.keys.done_channel, result_ttl_s,
                      self.keys.bytes_prefix(shard_of_job(job_id)),
                      self.keys.results_channel],
            ))
        if reply == "running":
            raise NotCancellable(f"job {job_id} is running and can no longer be cancelled")
        return reply

    def get(self, job_id: str) -> JobView | None:
        """The job as a client sees it; None when it does not exist (or expired)."""
        return self.get_many([job_id])[0]

    def get_many(self, job_ids: Sequence[str]) -> list[JobView | None]:
        """Several jobs in one round trip (``read.lua``, one call per shard), never
        their inputs, which may be large; a claimed job reads as running."""
        return [view_from_record(job_id, h) if h and "status" in h else None
                for job_id, h in zip(job_ids, self.read_records(job_ids), strict=True)]

    def read_records(self, job_ids: Sequence[str]) -> list[dict[str, str] | None]:
        """The jobs' records, parsed (carpool/backend/records.py) as a client reads them: a
        queued record without its input, and with status "running" when a claim holds
        its job; None where there is none."""
        by_shard: dict[str, list[int]] = {}
        for i, job_id in enumerate(job_ids):
            by_shard.setdefault(shard_of_job(job_id), []).append(i)
        calls = [([self.keys.job(job_ids[i]) for i in idx],
                  [self.keys.bin_prefix(tag), self.keys.job_prefix(tag)])
                 for tag, idx in by_shard.items()]
        with redis_errors():
            replies = self._read_calls(calls)
        out: list[dict[str, str] | None] = [None] * len(job_ids)
        for idx, reply in zip(by_shard.values(), replies, strict=True):
            for i, row in zip(idx, reply, strict=True):
                out[i] = records.parse(str(row)) if row is not None else None
        return out

    def _read_calls(self, calls: list[tuple[list[str], list[str]]]) -> list[Any]:
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

    def _pipelined_reads(self, calls: list[tuple[list[str], list[str]]]) -> list[Any]:
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
