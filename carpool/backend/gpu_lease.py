"""GPU leases in Redis: which worker holds which GPU, one typed method per Lua script.

``docker compose --scale worker=N`` shows every replica every GPU, so each worker
claims one by a lease keyed by the GPU's UUID (unique across hosts), renews it
while alive and releases it on a warm shutdown; a dead worker's GPU comes free
when its lease runs out. ``worker.device.gpu`` drives these calls; this module only
speaks the protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import redis

from carpool.backend.args import GpuClaimArgs, GpuReleaseArgs, GpuRenewArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.core.script_args import argv, keys_of

#: Tokens kept in the GPU free list; each wakes one waiting worker, so a few suffice.
FREE_LIST_CAP = 16


@dataclass(frozen=True)
class ClaimAnswer:
    """The GPU won (``uuid``), or None and how long until a lease could lapse."""

    uuid: str | None
    wait_ms: int


class GpuLeases:
    """Claim, renew and release GPU leases; ``holder`` names a worker (its node name)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._claim = load_script(client, "gpu_claim")
        self._renew = load_script(client, "gpu_renew")
        self._release = load_script(client, "gpu_release")

    def claim(self, uuids: Sequence[str], holder: str, lease_ms: int) -> ClaimAnswer:
        """Lease the first free GPU of ``uuids`` (or one ``holder`` holds already)."""
        with redis_errors():
            index, wait_ms = self._claim(
                keys=keys_of(GpuClaimArgs, gpus=[self.keys.gpu(u) for u in uuids]),
                args=argv(GpuClaimArgs(holder, lease_ms)))
        return ClaimAnswer(uuids[int(index) - 1] if int(index) else None, int(wait_ms))

    def renew(self, uuid: str, holder: str, lease_ms: int) -> str:
        """"renewed", "retaken" (had lapsed, was free), or the name of its new holder."""
        with redis_errors():
            return str(self._renew(keys=keys_of(GpuRenewArgs, gpu=self.keys.gpu(uuid)),
                                   args=argv(GpuRenewArgs(holder, lease_ms))))

    def release(self, uuid: str, holder: str) -> bool:
        """Free the GPU and wake one waiting worker; False when it was not ``holder``'s."""
        with redis_errors():
            done = self._release(
                keys=keys_of(GpuReleaseArgs, gpu=self.keys.gpu(uuid), free=self.keys.gpu_free),
                args=argv(GpuReleaseArgs(holder, uuid, FREE_LIST_CAP)))
        return bool(done)

    def holders(self, uuids: Sequence[str]) -> dict[str, str | None]:
        """Who holds each GPU now (for logs and Flower)."""
        with redis_errors():
            names = cast(list[str | None], self.client.mget([self.keys.gpu(u) for u in uuids]))
        return dict(zip(uuids, names, strict=True))

    def wait_for_release(self, timeout_s: float) -> bool:
        """Block until some worker releases a GPU, or ``timeout_s`` passes."""
        with redis_errors():
            got = self.client.blpop([self.keys.gpu_free], timeout=timeout_s)
        return got is not None
