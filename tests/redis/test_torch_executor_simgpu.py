"""The torch executor on the simulated CUDA device driven by the real batching loop
and Redis: the loop claims no more than the memory guard's cap."""

from __future__ import annotations

import json

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.jobs import JobStatus, new_job_id
from carpool.core.settings import Settings
from tests.support.observed import Recorder
from tests.support.simcuda import SimCuda, SimHandler
from tests.unit.test_torch_executor import BIN, KEY, SPEC, executor
from worker.loop.loop import BatchLoop


def test_the_loop_claims_no_more_than_the_memory_guards_cap(
        settings: Settings, queue: Queue) -> None:
    sim = SimCuda(1 << 30)
    handler = SimHandler(sim, SPEC)
    ex = executor(sim)
    ex.guard.on_out_of_memory(KEY, 4)  # capped at 2 for the next CLEAN_BATCHES batches
    heard = Recorder()
    loop = BatchLoop(settings, queue, {"sim": handler}, "w-sim",
                     observers=[heard], executor=ex)
    ids = [single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        SPEC, (AdmitJob(BIN, new_job_id(SPEC.name), json.dumps({"x": x})),), queued_ttl_s=60))).id
           for x in range(8)]
    for _ in range(100):  # bounded: each step claims, completes or waits <= 1 s
        if all((v := queue.get(i)) is not None and v.status.is_final for i in ids):
            break
        loop.step()
    loop.drain()
    ex.close()
    views = [queue.get(i) for i in ids]
    assert [v.status for v in views if v] == [JobStatus.DONE] * 8
    assert [r.size for r in heard.reports()] == [2, 2, 2, 2]
