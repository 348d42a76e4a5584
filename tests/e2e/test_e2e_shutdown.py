"""A warm shutdown (SIGTERM) of a real worker finishes the batch in hand."""

from __future__ import annotations

import json
import signal

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.jobs import JobStatus, new_job_id
from carpool.core.settings import Settings
from tests.conftest import make_env
from tests.support.procs import start_worker, wait_until

#: One batch takes this long, so SIGTERM surely lands while it runs.
SLOW_BATCH_MS = 2000


def test_sigterm_lets_the_batch_in_hand_finish(
        queue: Queue, settings: Settings, redis_url: str, key_prefix: str) -> None:
    env = make_env(redis_url, key_prefix, CARPOOL_SYNTHETIC_COST_MS=f"{SLOW_BATCH_MS},0")
    spec = settings.catalogue.get("synthetic")
    with start_worker(env) as proc:
        ids = [single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
            spec, (AdmitJob(spec.bins[0], new_job_id(spec.name),
                            json.dumps({"value": i, "size": 1})),),
            queued_ttl_s=60))).id for i in range(3)]

        def running() -> bool:
            views = [queue.get(i) for i in ids]
            return all(v is not None and v.status is JobStatus.RUNNING for v in views)

        wait_until(running, 20, "the batch to be claimed")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    views = [queue.get(i) for i in ids]
    assert [v.status for v in views if v is not None] == [JobStatus.DONE] * 3
