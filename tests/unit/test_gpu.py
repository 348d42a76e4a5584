"""The GPU a worker claims, without Redis: only the claimed one made visible to CUDA,
the device list read from nvidia-smi (or what to set without it), and the check that
a process sees exactly the claimed GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from carpool.core.errors import ConfigError
from worker.device import gpu as gpu_module
from worker.device.gpu import discover_gpus, make_visible, verify_visible

GPUS = discover_gpus(["GPU-aaaa", "GPU-bbbb", "GPU-cccc"])


def test_the_claimed_gpu_alone_is_made_visible_to_cuda() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    make_visible(GPUS[2], environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": "GPU-cccc"}


def test_without_nvidia_smi_the_claim_fails_at_start_with_what_to_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_module, "NVIDIA_SMI", ("carpool-no-such-nvidia-smi",))
    with pytest.raises(ConfigError, match="CARPOOL_GPU_DEVICES"):
        discover_gpus()


class CudaSees:
    """What a process's ``torch.cuda`` would report: these device UUIDs (no "GPU-")."""

    def __init__(self, *uuids: str) -> None:
        self.uuids = uuids

    def device_count(self) -> int:
        return len(self.uuids)

    def get_device_properties(self, device: int) -> Any:
        return SimpleNamespace(uuid=self.uuids[device])


def test_a_process_that_sees_exactly_the_claimed_gpu_passes_the_check() -> None:
    verify_visible(GPUS[1], CudaSees("bbbb"))


@pytest.mark.parametrize(("sees", "why"), [
    (("aaaa", "bbbb", "cccc"), "sees 3 devices"),
    (("aaaa",), "device 0 is GPU-aaaa"),
    ((), "sees 0 devices"),
])
def test_a_process_that_enumerated_cuda_before_the_claim_refuses_to_start(
        sees: tuple[str, ...], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        verify_visible(GPUS[1], CudaSees(*sees))
