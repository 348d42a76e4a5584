"""The torch-free pipeline: the synthetic model through the real loop and Redis,
two batches in flight, every job its own result."""

from __future__ import annotations

import json

import pytest

from carpool.catalogue import load_catalogue
from carpool.jobs import Claim, JobStatus, new_job_id
from carpool.queue import Queue
from carpool.settings import Settings
from carpool.synthetic import expected_result
from worker.handlers.synthetic import SyntheticHandler
from worker.loop import BatchLoop, BatchReport
from worker.pipeline import PipelinedExecutor

SPEC = load_catalogue(None).get("synthetic")


def test_synthetic_batches_overlap_and_every_job_gets_its_own_result(
        settings: Settings, queue: Queue) -> None:
    phases: list[str] = []

    def listener(phase: str, claim: Claim, report: BatchReport | None) -> None:
        phases.append(phase)

    small = SPEC.bin_named("small")
    inputs = [{"value": i, "size": 1} for i in range(70)]
    ids = [queue.admit(SPEC, small, new_job_id(), json.dumps(x), queued_ttl_s=60).id
           for x in inputs]
    executor = PipelinedExecutor(depth=2, preprocess_threads=2)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (5, 0))},
                     "w-test", listeners=[listener], executor=executor)
    for _ in range(50):  # bounded
        if all((v := queue.get(i)) is not None and v.status.is_final for i in ids):
            break
        loop.step()
    else:
        pytest.fail("jobs did not finish")
    loop.drain()
    executor.close()
    views = [queue.get(i) for i in ids]
    assert [v.status for v in views if v] == [JobStatus.DONE] * 70
    assert [v.result for v in views if v] == [expected_result(x) for x in inputs]
    assert phases[:3] == ["started", "started", "finished"]  # batch 2 claimed during 1
