"""A worker started with the GPU claim on, while every GPU it may use is held."""

from __future__ import annotations

import signal
from pathlib import Path

from carpool.backend.gpu_lease import GpuLeases
from tests.conftest import make_env
from tests.redis.test_gpu_claim import LONG_LEASE_MS, leases
from tests.support.procs import STOP_TIMEOUT_S, WORKER_START_TIMEOUT_S, running, worker_command

__all__ = ["leases"]  # the fixture, shared with the claim tests against Redis


def test_a_worker_with_no_free_gpu_waits_says_so_and_stops_on_sigterm(
        leases: GpuLeases, redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    gpu = f"GPU-{key_prefix}"
    assert leases.claim([gpu], "busy@elsewhere", LONG_LEASE_MS).uuid == gpu
    log_path = tmp_path / "worker.log"
    env = make_env(redis_url, key_prefix, CARPOOL_MODELS="synthetic", CARPOOL_GPU_CLAIM="1",
                   CARPOOL_GPU_DEVICES=gpu, CARPOOL_WORKER_METRICS_PORT="0")
    cmd = [*worker_command("waiting@carpool-test"), "--logfile", str(log_path)]

    def waiting() -> bool:
        return log_path.exists() and "waiting for a free GPU" in log_path.read_text()

    with running(cmd, env, waiting, "celery", WORKER_START_TIMEOUT_S) as proc:
        assert f"{gpu} by busy@elsewhere" in log_path.read_text()
        assert "ready." not in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0
    assert leases.holders([gpu]) == {gpu: "busy@elsewhere"}
