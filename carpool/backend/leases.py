"""Leases after the claim: renew them, take back the expired ones, hand them back.

claim.lua leases jobs and complete.lua ends the lease; the three scripts here cover
what happens in between. Like ``carpool.backend.queue``, every Redis error becomes
``BackendUnavailable``, and each script has one typed method.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import redis

from carpool.backend.args import ReapArgs, ReclaimArgs, ReleaseArgs, RenewArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.queue import WAKE_LIST_CAP
from carpool.core.catalogue import DEFAULT_RESULT_TTL_S, Catalogue
from carpool.core.script_args import argv, keys_of
from carpool.core.shards import shard, shard_of_job

#: Jobs one reap call takes back at most (whole claims, at least one); the rest wait
#: for the next call, so one call never holds Redis for long, whatever the backlog.
REAP_BATCH = 500
#: Ids kept on the dead list; older ones fall off (their records keep the reason).
DEAD_LIST_CAP = 10_000
#: The claim hash's own fields (claim.lua): its time and worker; every other is a job id.
CLAIM_META_FIELDS = frozenset({"t", "w"})


@dataclass(frozen=True)
class ReapReport:
    """What one reap call did."""

    now_ms: int
    requeued: int  # back at the front of their bin
    failed: int  # lost max_attempts times: failed, and on the dead list
    dropped: int  # stale lease entries of jobs that had ended or expired

    @property
    def reclaimed(self) -> int:
        """Leases taken back from workers that stopped renewing them."""
        return self.requeued + self.failed


def token_prefix(worker: str) -> str:
    """What every claim token ``worker`` makes starts with (``claim_token``)."""
    return f"{worker}:"


def claim_token(worker: str, seq: int) -> str:
    """A claim's lease token: the worker's name (a worker restarted under it ends its
    predecessor's leases by it: ``Leases.end_leases_of``), a random part, a count."""
    return f"{token_prefix(worker)}{uuid.uuid4().hex[:8]}:{seq}"


def _by_shard(ids: Sequence[str]) -> dict[str, list[int]]:
    """Positions of ``ids`` by their shard (a claim's jobs share one: its model's)."""
    out: dict[str, list[int]] = {}
    for i, job_id in enumerate(ids):
        out.setdefault(shard_of_job(job_id), []).append(i)
    return out


class Leases:
    """Renew, reap and release leases; each is one Lua script call."""

    def __init__(self, client: redis.Redis, keys: Keys, catalogue: Catalogue) -> None:
        self.client = client
        self.keys = keys
        self._ttls: list[str | int] = []
        for spec in catalogue:
            self._ttls += [spec.name, spec.result_ttl_s]
        #: The catalogue's shards, each reaped on its own.
        self._shards = sorted({shard(spec.name) for spec in catalogue})
        self._renew = load_script(client, "renew")
        self._reap = load_script(client, "reap")
        self._release = load_script(client, "release")
        self._reclaim = load_script(client, "reclaim")

    def renew(self, token: str, ids: Sequence[str], lease_ms: int) -> list[bool]:
        """Extend the lease of each id still held under ``token``; False where it was lost."""
        held = [False] * len(ids)
        for tag, positions in _by_shard(ids).items():
            with redis_errors():
                reply = self._renew(
                    keys=keys_of(RenewArgs, leases=self.keys.leases(tag),
                              claim=self.keys.claim(tag, token)),
                    args=argv(RenewArgs(token, lease_ms), (ids[i] for i in positions)))
            for i, x in zip(positions, reply[1:], strict=True):
                held[i] = bool(x)
        return held

    def reap(self, max_attempts: int, limit: int = REAP_BATCH) -> ReapReport:
        """Take back the jobs of expired claims, whole claims up to about ``limit`` jobs
        per shard: requeue each at the front of its bin, or fail it."""
        total = ReapReport(0, 0, 0, 0)
        for tag in self._shards:  # one call per shard: a script touches one shard only
            args = ReapArgs(
                batch=limit, max_attempts=max_attempts, job_prefix=self.keys.job_prefix(tag),
                bin_prefix=self.keys.bin_prefix(tag), wake_prefix=self.keys.wake_prefix(tag),
                done_channel=self.keys.done_channel, dead_cap=DEAD_LIST_CAP,
                wake_cap=WAKE_LIST_CAP, result_ttl_s=DEFAULT_RESULT_TTL_S,
                claim_prefix=self.keys.claim_prefix(tag))
            keys = keys_of(ReapArgs, leases=self.keys.leases(tag), dead=self.keys.dead(tag),
                           outbox=self.keys.outbox(tag), hook_wake=self.keys.hook_wake(tag))
            with redis_errors():
                reply = self._reap(keys=keys, args=argv(args, self._ttls))
            now_ms, requeued, failed, dropped = (int(x) for x in reply)
            total = ReapReport(max(total.now_ms, now_ms), total.requeued + requeued,
                               total.failed + failed, total.dropped + dropped)
        return total

    def release(self, token: str, ids: Sequence[str], *, refund_attempt: bool) -> list[bool]:
        """Hand the ids still held under ``token`` back to the front of their bin."""
        back = [False] * len(ids)
        for tag, positions in _by_shard(ids).items():
            args = ReleaseArgs(token, self.keys.job_prefix(tag), self.keys.bin_prefix(tag),
                               self.keys.wake_prefix(tag), WAKE_LIST_CAP, refund_attempt)
            with redis_errors():
                reply = self._release(
                    keys=keys_of(ReleaseArgs, leases=self.keys.leases(tag),
                              claim=self.keys.claim(tag, token)),
                    args=argv(args, (ids[i] for i in positions)))
            for i, x in zip(positions, reply, strict=True):
                back[i] = bool(x)
        return back

    def end_leases_of(self, worker: str) -> int:
        """End now the leases of every claim made under ``worker``'s name (its tokens
        start with ``token_prefix(worker)``): a worker starting under that name knows its
        predecessor dead. The next reap takes their jobs back. How many claims ended."""
        ended = 0
        for tag in self._shards:
            with redis_errors():
                ended += int(self._reclaim(keys=keys_of(ReclaimArgs, leases=self.keys.leases(tag)),
                                           args=argv(ReclaimArgs(token_prefix(worker)))))
        return ended

    def leased_to(self, token: str) -> list[str]:
        """The ids leased under ``token``: a claim whose reply was lost. Its claim hash
        names them; the claim's model is one of the catalogue's, on one of its shards."""
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for tag in self._shards:
                pipe.hkeys(self.keys.claim(tag, token))
            found = pipe.execute()
        return [str(f) for fields in found for f in fields if f not in CLAIM_META_FIELDS]

    def dead_letters(self, limit: int = 100) -> list[str]:
        """The ids most recently failed by the reaper, newest first (per model)."""
        with redis_errors():
            return [job_id for tag in self._shards
                    for job_id in cast(list[str], self.client.lrange(self.keys.dead(tag), 0,
                                                                     limit - 1))][:limit]
