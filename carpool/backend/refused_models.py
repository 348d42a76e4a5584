"""Failing the queued jobs of a model that every live worker refused.

The web refuses such a model at submit (carpool/backend/registry.py), but jobs
admitted while a worker was still loading it, or before any worker registered
(start-up, a restart, scale from zero), are already queued: without this they would
wait out ``CARPOOL_QUEUED_TTL_S``. A worker that refused a model ends them "failed"
as soon as every live worker that tried it refused it, none serving it or still
loading it; while another live worker is still loading it, only once the refusal
has lasted ``CARPOOL_REFUSED_GRACE_S`` (worker/shell/refusal_watch.py). One script call
per bin (lua/fail_queued.lua), safe from several workers at once.
"""

from __future__ import annotations

import redis

from carpool.backend.args import FailQueuedArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.registry import Availability
from carpool.core.catalogue import ModelSpec
from carpool.core.jobs import MODEL_UNAVAILABLE
from carpool.core.script_args import argv, keys_of
from carpool.core.shards import shard

#: Jobs ended per script call: bounds how long one call holds Redis.
FAIL_BATCH = 500


def first_refusal(found: Availability) -> str:
    """The first refusing worker and its reason."""
    worker, reason = sorted(found.refused.items())[0]
    return f"worker {worker} refused it: {reason}"


def refusal_message(model: str, found: Availability) -> str:
    """Why no live worker runs ``model``: the first refusing worker and its reason."""
    return f"no live worker serves model {model!r}: {first_refusal(found)}"


def failed_message(model: str, found: Availability, grace_s: float) -> str:
    """A failed job's error: its code, then the refusal, and, when a worker was still
    loading the model, the grace that ran out."""
    message = f"{MODEL_UNAVAILABLE}: {refusal_message(model, found)}"
    if found.loading_by:
        message += (f" (a worker still loading it did not serve it within "
                    f"CARPOOL_REFUSED_GRACE_S, {grace_s:g} s)")
    return message


class RefusedJobs:
    """Ends the queued jobs of a model's bins "failed" (fail_queued.lua)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.keys = keys
        self._fail = load_script(client, "fail_queued")

    def fail_queued(self, spec: ModelSpec, message: str) -> int:
        """Jobs ended, over every bin of ``spec``; a job already claimed is left alone."""
        ended = 0
        for b in spec.bins:
            while True:
                with redis_errors():
                    n, dropped = self._fail(
                        keys=keys_of(FailQueuedArgs, bin=self.keys.bin(spec.name, b.name),
                                     bytes=self.keys.queued_bytes(spec.name),
                                     outbox=self.keys.outbox(shard(spec.name)),
                                     hook_wake=self.keys.hook_wake(shard(spec.name))),
                        args=argv(FailQueuedArgs(self.keys.job_prefix(shard(spec.name)),
                                                 self.keys.done_channel, spec.result_ttl_s,
                                                 message, FAIL_BATCH)))
                ended += int(n)
                if int(n) + int(dropped) < FAIL_BATCH:
                    break
        return ended
