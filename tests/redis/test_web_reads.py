"""Concurrent result reads (web.results.reads) and one-job admissions (Admissions with coalesce)
share round trips; each gets its own answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace

from carpool.backend.admissions import (
    Admissions,
    AdmitJob,
    AdmitOutcome,
    AdmitRequest,
    single_admitted,
)
from carpool.backend.queue import Queue
from carpool.core.catalogue import builtin_models
from carpool.core.errors import BinFull
from carpool.core.jobs import Admitted, JobView, new_job_id
from tests.support.procs import wait_until
from web.results.reads import ReadBatcher


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
    ids = [single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], new_job_id(spec.name), json.dumps({"value": i, "size": 1})),),
        queued_ttl_s=60))).id for i in range(9)]
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
    wait_until(lambda: reads.calls.waiting() == 9, 10, "nine reads waiting")  # behind the first
    held.release.set()
    for t in [first, *others]:
        t.join(10)
    assert held.calls == [1, 9]  # two round trips for ten reads
    assert all(got[i] is not None and got[i].id == i for i in ids)  # type: ignore[union-attr]
    assert got["no-such-job"] is None
    assert reads.get(ids[0]) is not None and held.calls[-1] == 1  # idle again: goes at once


class HeldAdmissions(Admissions):
    """Real, coalescing Admissions whose first admit.lua call waits until the test lets
    it go."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue.client, queue.keys, coalesce=True)
        self.release = threading.Event()
        self.sent: list[int] = []

    def _uncoalesced(self, request: AdmitRequest) -> list[AdmitOutcome]:
        self.sent.append(len(request.jobs))
        if len(self.sent) == 1:
            assert self.release.wait(10)
        return super()._uncoalesced(request)


def test_admissions_that_arrive_during_one_share_the_next_admit_call(queue: Queue) -> None:
    spec = replace(builtin_models()["synthetic"],
                   bins=(replace(builtin_models()["synthetic"].bins[0], max_depth=6),))
    held = HeldAdmissions(queue)
    got: dict[int, object] = {}

    def admit(i: int) -> None:
        job = AdmitJob(spec.bins[0], new_job_id(spec.name), f'{{"v": {i}}}')
        (got[i],) = held.admit(AdmitRequest(spec, (job,), 60))

    first = threading.Thread(target=admit, args=(0,))
    first.start()
    wait_until(lambda: held.sent == [1], 10, "the first admission's call")
    others = [threading.Thread(target=admit, args=(i,)) for i in range(1, 8)]
    for t in others:
        t.start()
    wait_until(lambda: held.calls is not None and held.calls.waiting() == 7, 10,
               "seven admissions waiting")
    held.release.set()
    for t in [first, *others]:
        t.join(10)
    assert held.sent == [1, 7]  # two admit.lua calls for eight submissions
    assert sum(isinstance(v, Admitted) for v in got.values()) == 6  # the bound, exactly
    assert sum(isinstance(v, BinFull) for v in got.values()) == 2
    assert queue.client.zcard(queue.keys.bin("synthetic", "small")) == 6
