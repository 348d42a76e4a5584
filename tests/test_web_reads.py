"""web.reads: concurrent result reads share round trips, and each gets its own job."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from carpool.catalogue import builtin_models
from carpool.jobs import JobView, new_job_id
from carpool.queue import Queue
from tests.procs import wait_until
from web.reads import ReadBatcher


class HeldQueue(Queue):
    """A real Queue whose first round trip waits until the test lets it go."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue.client, queue.keys)
        self.release = threading.Event()
        self.calls: list[int] = []

    def get_many(self, job_ids: Sequence[str]) -> list[JobView | None]:
        self.calls.append(len(job_ids))
        if len(self.calls) == 1:
            assert self.release.wait(10)
        return super().get_many(job_ids)


def test_reads_that_arrive_during_a_round_trip_share_the_next_one(queue: Queue) -> None:
    spec = builtin_models()["synthetic"]
    ids = [queue.admit(spec, spec.bins[0], new_job_id(spec.name),
                        json.dumps({"value": i, "size": 1}),
                       queued_ttl_s=60).id for i in range(9)]
    held = HeldQueue(queue)
    reads = ReadBatcher(held)
    got: dict[str, JobView | None] = {}

    def read(job_id: str) -> None:
        got[job_id] = reads.get(job_id)

    first = threading.Thread(target=read, args=(ids[0],))
    first.start()
    wait_until(lambda: held.calls == [1], 10, "the first read's round trip")
    others = [threading.Thread(target=read, args=(i,)) for i in [*ids[1:], "no-such-job"]]
    for t in others:
        t.start()
    wait_until(lambda: len(reads._pending) == 9, 10, "nine reads waiting")  # behind the first
    held.release.set()
    for t in [first, *others]:
        t.join(10)
    assert held.calls == [1, 9]  # two round trips for ten reads
    assert all(got[i] is not None and got[i].id == i for i in ids)  # type: ignore[union-attr]
    assert got["no-such-job"] is None
    assert reads.get(ids[0]) is not None and held.calls[-1] == 1  # idle again: goes at once
