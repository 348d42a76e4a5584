"""One GPU per worker when every replica sees every GPU (``docker compose --scale``).

With ``CARPOOL_GPU_CLAIM=1`` a worker, before its models load, lists the host's
GPUs, claims a free one by a lease in Redis keyed by the GPU's UUID
(``carpool.backend.gpu_lease``), makes only that GPU visible to CUDA, renews the lease
in a thread while it lives and releases it on a warm shutdown. A worker that
finds no free GPU waits, and says so in its log, until one is released or a
dead worker's lease runs out.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from carpool.backend.connection import connect
from carpool.backend.gpu_lease import GpuLeases
from carpool.backend.keys import Keys
from carpool.core.errors import BackendUnavailable, ConfigError
from carpool.core.settings import Settings

log = logging.getLogger(__name__)

#: UUIDs from nvidia-smi, not from torch.cuda: asking torch initialises CUDA in this
#: process, after which CUDA_VISIBLE_DEVICES no longer has any effect.
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=uuid,name", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT_S = 30.0
#: Longest single wait on Redis while no GPU is free, so a stop request is noticed.
MAX_WAIT_S = 1.0
#: Shortest wait: BLPOP's timeout 0 would mean "forever".
MIN_WAIT_S = 0.01
#: How often a waiting worker says again that it waits.
WAIT_LOG_EVERY_S = 30.0
#: Renewals per lease time: two may fail (a Redis hiccup) before the lease lapses.
RENEWALS_PER_LEASE = 3


@dataclass(frozen=True)
class Gpu:
    uuid: str  # "GPU-<uuid>", as nvidia-smi prints it and CUDA_VISIBLE_DEVICES takes it
    name: str = ""


def discover_gpus(injected: Sequence[str] = ()) -> list[Gpu]:
    """``injected`` UUIDs (CARPOOL_GPU_DEVICES) if any, else the GPUs nvidia-smi lists."""
    if injected:
        return [Gpu(uuid) for uuid in injected]
    try:
        out = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, check=True,
                             timeout=NVIDIA_SMI_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(
            f"CARPOOL_GPU_CLAIM=1, but nvidia-smi could not list the GPUs ({exc}); list their "
            "UUIDs in CARPOOL_GPU_DEVICES, or set CARPOOL_GPU_CLAIM=0 on a host without GPUs"
        ) from exc
    gpus = [Gpu(*(part.strip() for part in line.split(",", 1)))
            for line in out.splitlines() if line.strip()]
    if not gpus:
        raise ConfigError("CARPOOL_GPU_CLAIM=1, but nvidia-smi lists no GPU")
    return gpus


def make_visible(gpu: Gpu, environ: MutableMapping[str, str] = os.environ) -> None:
    """Show CUDA this GPU alone (as cuda:0); refuses once CUDA is initialised."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise ConfigError(f"CUDA was initialised before the GPU claim: {gpu.uuid} cannot be "
                          "selected through CUDA_VISIBLE_DEVICES any more")
    if environ.get("CUDA_VISIBLE_DEVICES") not in (None, gpu.uuid):
        log.info("CARPOOL_GPU_CLAIM=1 replaces CUDA_VISIBLE_DEVICES=%s",
                 environ["CUDA_VISIBLE_DEVICES"])
    environ["CUDA_VISIBLE_DEVICES"] = gpu.uuid


class CudaView(Protocol):
    """What ``verify_visible`` asks of ``torch.cuda``."""

    def device_count(self) -> int: ...

    def get_device_properties(self, device: int) -> Any: ...


def verify_visible(gpu: Gpu, cuda: CudaView | None = None) -> None:
    """Check, once torch is imported, that CUDA sees exactly the claimed GPU.

    ``CUDA_VISIBLE_DEVICES`` works only if it is set before CUDA enumerates the
    devices; a process that had already done so (an import that queried CUDA,
    a library that initialised it) would ignore it silently and run on
    whichever GPU is device 0, shared with another worker. Without torch
    imported (a worker of torch-free models) there is nothing to check.
    """
    if cuda is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return  # no torch model: nothing in this process uses CUDA
        cuda = torch.cuda
    count = cuda.device_count()
    if count != 1:
        raise ConfigError(f"claimed GPU {gpu.uuid}, but CUDA sees {count} devices: "
                          "CUDA_VISIBLE_DEVICES was set after CUDA had enumerated them")
    seen = str(cuda.get_device_properties(0).uuid)
    if f"GPU-{seen}" != gpu.uuid and seen != gpu.uuid:
        raise ConfigError(f"claimed GPU {gpu.uuid}, but CUDA's device 0 is GPU-{seen}")
    log.info("CUDA sees exactly the claimed GPU %s", gpu.uuid)


class GpuClaim:
    """Holds one GPU for the life of one worker (``holder``: its Celery node name)."""

    def __init__(self, leases: GpuLeases, gpus: Sequence[Gpu], holder: str,
                 lease_ms: int) -> None:
        if not gpus:
            raise ConfigError("no GPU to claim")
        self.leases = leases
        self.gpus = list(gpus)
        self.holder = holder
        self.lease_ms = lease_ms
        self.gpu: Gpu | None = None
        self.renewals = 0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, should_stop: Callable[[], bool] = lambda: False) -> Gpu | None:
        """Block until a GPU is this worker's; None if ``should_stop()`` comes first."""
        uuids = [g.uuid for g in self.gpus]
        next_log_at = 0.0
        while not should_stop():
            try:
                answer = self.leases.claim(uuids, self.holder, self.lease_ms)
            except BackendUnavailable as exc:
                log.warning("cannot claim a GPU: %s; retrying in %.0f s", exc, MAX_WAIT_S)
                self._stop.wait(MAX_WAIT_S)  # Redis is down: nothing to block on
                continue
            if answer.uuid is not None:
                self.gpu = next(g for g in self.gpus if g.uuid == answer.uuid)
                log.info("claimed GPU %s %s (lease %d ms)", self.gpu.uuid, self.gpu.name,
                         self.lease_ms)
                return self.gpu
            if time.monotonic() >= next_log_at:
                held = ", ".join(f"{u} by {h}" for u, h in self.leases.holders(uuids).items())
                log.warning("waiting for a free GPU: all %d are held (%s); one comes free when "
                            "its worker stops or its lease lapses", len(uuids), held)
                next_log_at = time.monotonic() + WAIT_LOG_EVERY_S
            wait_s = min(MAX_WAIT_S, max(MIN_WAIT_S, answer.wait_ms / 1000.0))
            try:
                self.leases.wait_for_release(wait_s)
            except BackendUnavailable:
                continue  # the next claim says what is wrong
        return None

    def keep(self) -> None:
        """Renew the lease in a daemon thread until ``release``."""
        self._renewer = threading.Thread(target=self._renew_until_stopped,
                                         name="carpool-gpu-lease", daemon=True)
        self._renewer.start()

    def _renew_until_stopped(self) -> None:
        assert self.gpu is not None
        interval_s = self.lease_ms / 1000.0 / RENEWALS_PER_LEASE
        last = "renewed"
        while not self._stop.wait(interval_s):  # a timer: renewals are due by the clock
            try:
                state = self.leases.renew(self.gpu.uuid, self.holder, self.lease_ms)
            except BackendUnavailable as exc:
                log.warning("could not renew the lease on GPU %s: %s", self.gpu.uuid, exc)
                continue
            self.renewals += 1
            if state != last:
                if state == "retaken":
                    log.warning("the lease on GPU %s had lapsed; taken back", self.gpu.uuid)
                elif state != "renewed":
                    log.error("the lease on GPU %s lapsed and %s claimed it: two workers now "
                              "share this GPU", self.gpu.uuid, state)
            last = state if state != "retaken" else "renewed"

    def release(self) -> None:
        """Stop renewing and hand the GPU back, waking one waiting worker."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.gpu is None:
            return
        try:
            if self.leases.release(self.gpu.uuid, self.holder):
                log.info("released GPU %s", self.gpu.uuid)
        except BackendUnavailable as exc:
            log.warning("could not release GPU %s (%s): it comes free when its lease lapses",
                        self.gpu.uuid, exc)
        self.gpu = None


def claim_gpu(settings: Settings, holder: str,
              should_stop: Callable[[], bool]) -> GpuClaim | None:
    """With CARPOOL_GPU_CLAIM=1, a GPU held, renewed and made visible to CUDA.

    Blocks while no GPU is free. None when the claim is off, or when
    ``should_stop()`` became true before a GPU came free.
    """
    if not settings.gpu_claim:
        return None
    leases = GpuLeases(connect(settings.redis_url, cluster=settings.redis_cluster),
                       Keys(settings.key_prefix))
    claim = GpuClaim(leases, discover_gpus(settings.gpu_devices), holder, settings.gpu_lease_ms)
    gpu = claim.acquire(should_stop)
    if gpu is None:
        return None
    make_visible(gpu)
    claim.keep()
    return claim


def describe_gpu(claimed: Gpu | None) -> dict[str, str]:
    """The worker's GPU for Flower: the claimed one, else CUDA's current device, else CPU."""
    if claimed is not None:
        return {"device": "cuda", "uuid": claimed.uuid, "name": claimed.name}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"device": "cuda", "uuid": f"GPU-{props.uuid}", "name": str(props.name)}
    return {"device": "cpu", "uuid": "", "name": ""}
