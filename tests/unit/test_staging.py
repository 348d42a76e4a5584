"""Pinned-buffer staging on a simulated CUDA device: a buffer is never refilled
while a copy from it is pending, nor handed to a second thread while one fills it."""

from __future__ import annotations

import threading

import torch

from tests.support.simcuda import SimCuda
from worker.executors.staging import Staged, Staging

#: A bound on any wait here; reaching it is a failure, not a timing.
TIMEOUT_S = 30.0


def batch(x: float) -> torch.Tensor:
    return torch.full((2, 3), x)


def landed(sim: SimCuda, staged: Staged) -> torch.Tensor:
    """The batch as it reached the device, once every copy has run."""
    sim.synchronize()
    assert isinstance(staged.batch, torch.Tensor)
    return staged.batch


def test_a_pinned_buffer_is_not_refilled_while_its_copy_is_pending() -> None:
    sim = SimCuda(1 << 30)
    staging = Staging(sim)
    # Three batches, two buffers: the third reuses the first's buffer, whose copy
    # has not run (nothing waited on it yet).
    staged = [staging.to_device(batch(x)) for x in (1.0, 2.0, 3.0)]
    assert [float(landed(sim, s)[0, 0]) for s in staged] == [1.0, 2.0, 3.0]
    assert sim.hazards == []
    assert staging.pinned_allocations == 2


def test_a_buffer_being_filled_by_one_thread_is_never_handed_to_another() -> None:
    sim = SimCuda(1 << 30)
    staging = Staging(sim)
    inside, resume = threading.Event(), threading.Event()
    waited: list[bool] = []

    def hold_the_first_copy() -> None:
        if not inside.is_set():
            inside.set()
            waited.append(resume.wait(TIMEOUT_S))

    sim.copy_hook = hold_the_first_copy
    held: list[Staged] = []
    # The compute thread re-stages a half and is held between filling its buffer
    # and issuing the copy, while the loop's thread stages two more batches.
    worker = threading.Thread(target=lambda: held.append(staging.to_device(batch(1.0))))
    worker.start()
    assert inside.wait(TIMEOUT_S)
    others = [staging.to_device(batch(x)) for x in (2.0, 3.0)]
    resume.set()
    worker.join(TIMEOUT_S)
    assert waited == [True]
    assert [float(landed(sim, s)[0, 0]) for s in (*held, *others)] == [1.0, 2.0, 3.0]
    assert sim.hazards == []


def test_a_buffer_pinned_by_the_compute_thread_in_inference_mode_is_refilled_outside_it(
) -> None:
    sim = SimCuda(1 << 30)
    staging = Staging(sim)
    with torch.inference_mode():  # the compute thread re-stages the halves of a batch
        halves = [staging.to_device(batch(x)) for x in (1.0, 2.0)]
    again = staging.to_device(batch(3.0))  # the loop's thread stages the next batch
    assert [float(landed(sim, s)[0, 0]) for s in (*halves, again)] == [1.0, 2.0, 3.0]
