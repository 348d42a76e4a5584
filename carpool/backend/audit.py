"""The invariant "each admitted job is in exactly one place", checked on a snapshot.

A queued job is in exactly one bin, once, and holds no lease; a running job holds
a lease and is in no bin; a finished job (done, failed, expired, cancelled) is in
neither. A claim does not write its jobs' records (claim.lua), so a running job's
record says "queued": held by a claim, it must be in no bin; held by none, in one.
``snapshot`` reads all of it in one read-only script, so the check holds for one
instant even while workers run; ``violations`` lists what breaks it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from carpool.backend.args import AuditArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.core.jobs import JobStatus
from carpool.core.script_args import argv, keys_of
from carpool.core.shards import shard


@dataclass(frozen=True)
class Snapshot:
    """Where every job of one key prefix was, at one instant."""

    bins: dict[str, list[str]]  # bin key -> ids, in order (duplicates kept)
    leases: dict[str, int]  # id -> lease deadline (ms)
    status: dict[str, str]  # id -> status, for every job record
    #: Ids held by more than one claim (each claim hash names its jobs): never allowed.
    leased_twice: tuple[str, ...] = ()

    def placed(self) -> Counter[str]:
        """How many times each id sits in some bin."""
        return Counter(i for ids in self.bins.values() for i in ids)


def snapshot(client: redis.Redis, keys: Keys, models: Iterable[str]) -> Snapshot:
    """Read bins, leases and every job's status of ``models``, each shard atomically."""
    script = load_script(client, "audit")
    raw_bins: list[Any] = []
    raw_leases: list[Any] = []
    raw_jobs: list[Any] = []
    for tag in sorted({shard(m) for m in models}):
        with redis_errors():
            reply: Any = script(
                keys=keys_of(AuditArgs, leases=keys.leases(tag)),
                args=argv(AuditArgs(keys.bin_pattern(tag), keys.job_pattern(tag),
                                    keys.job_prefix(tag), keys.claim_prefix(tag))))
        raw_bins += reply[0]
        raw_leases += reply[1]
        raw_jobs += reply[2]
    bins: dict[str, list[str]] = {}
    for i in range(0, len(raw_bins), 2):
        bins.setdefault(str(raw_bins[i]), []).append(str(raw_bins[i + 1]))
    leases = {str(raw_leases[i]): int(float(raw_leases[i + 1]))
              for i in range(0, len(raw_leases), 2)}
    status = {str(raw_jobs[i]): str(raw_jobs[i + 1]) for i in range(0, len(raw_jobs), 2)}
    held = Counter(str(raw_leases[i]) for i in range(0, len(raw_leases), 2))
    return Snapshot(bins, leases, status, tuple(sorted(i for i, n in held.items() if n > 1)))


def violations(snap: Snapshot, admitted: Iterable[str] = ()) -> list[str]:
    """Every break of the one-place invariant; ``admitted`` ids must also still exist."""
    found: list[str] = []
    placed = snap.placed()
    for job_id in sorted(set(admitted) - set(snap.status)):
        found.append(f"{job_id}: admitted, but its record is gone (lost)")
    for job_id, status in sorted(snap.status.items()):
        in_bins, leased = placed.get(job_id, 0), job_id in snap.leases
        if status == JobStatus.QUEUED:
            if in_bins != (0 if leased else 1):
                found.append(f"{job_id}: queued, in {in_bins} bin slots, leased={leased}")
        elif status == JobStatus.RUNNING:  # written by a version before claims wrote none
            if in_bins or not leased:
                found.append(f"{job_id}: running, in {in_bins} bin slots, leased={leased}")
        elif in_bins or leased:
            found.append(f"{job_id}: {status or 'no status'}, in {in_bins} bin slots, "
                         f"leased={leased}")
    for job_id in snap.leased_twice:
        found.append(f"{job_id}: held by more than one claim")
    for job_id in sorted((set(placed) | set(snap.leases)) - set(snap.status)):
        found.append(f"{job_id}: in a bin or leased, but has no record")
    return found
