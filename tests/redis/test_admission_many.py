"""Predicted wait and fair share inside one multi-job admit.lua call (real redis-server).

``Admissions.admit`` admits a bin's jobs in one call; each job is still judged as
if admitted alone, in order: the jobs of the call ahead of it count toward its
predicted wait, and its owner's count grows with each of the call's jobs admitted.
The first refused job ends the call; the jobs before it stay queued.
"""

from __future__ import annotations

import json

from carpool.admission.fair_share import FAIR_SHARE_NEAR
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import BinFull, OverShare, WaitTooLong
from carpool.core.jobs import Admitted, new_job_id
from tests.redis.test_admission import ALICE, BOB, DRAINED, TTL_S, drain, spec_with
from tests.support.jobs import admit

NEAR = int(FAIR_SHARE_NEAR * 100)


def admit_many(q: Queue, spec: ModelSpec, n: int, owner: str = "",
               ) -> list[Admitted | BinFull | Exception]:
    body = json.dumps({"value": 0, "size": 1})
    jobs = tuple(AdmitJob(spec.bins[0], new_job_id(spec.name), body) for _ in range(n))
    return list(Admissions(q.client, q.keys).admit(AdmitRequest(spec, jobs, TTL_S, owner=owner)))


def split(outcomes: list[Admitted | BinFull | Exception]) -> tuple[int, list[Exception]]:
    """How many were admitted, and the refusals after them (admitted ones come first)."""
    admitted = sum(isinstance(o, Admitted) for o in outcomes)
    assert all(isinstance(o, Admitted) for o in outcomes[:admitted])
    return admitted, [o for o in outcomes[admitted:] if isinstance(o, Exception)]


def test_a_batch_admits_only_the_jobs_predicted_to_start_in_time(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    # ~10 jobs/s and a 1 s limit: about 10 of the 50 fit, far below max_depth 1000.
    admitted, refused = split(admit_many(queue, spec, 50))
    assert 2 <= admitted <= 2 * DRAINED
    assert len(refused) == 50 - admitted
    assert all(isinstance(r, WaitTooLong) for r in refused)
    first = refused[0]
    assert isinstance(first, WaitTooLong)
    # The call's own admitted jobs are ahead of the first refused one.
    assert first.depth == admitted and first.predicted_ms > first.limit_ms == 1000
    assert queue.depths([(spec.name, "small")]) == [admitted]
    # A job sent alone now meets the same bin: refused as well.
    try:
        admit(queue, spec)
    except WaitTooLong:
        pass
    else:
        raise AssertionError("a single job was admitted after the batch's refusals")


def test_a_batch_within_the_first_max_batch_is_judged_by_depth_alone(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1, max_batch=8)
    drain(queue, spec)
    # A 1 ms limit refuses every job that waits behind a full batch, none within it.
    admitted, refused = split(admit_many(queue, spec, 20))
    assert admitted == 8 and all(isinstance(r, WaitTooLong) for r in refused)


def test_a_batch_counts_its_own_jobs_toward_its_owners_share(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=100)
    admit(queue, spec, owner=BOB)
    # Alice's batch passes NEAR of the bound while she holds nearly all of it: the
    # job at depth NEAR is the first one refused, and the rest of her batch with it.
    admitted, refused = split(admit_many(queue, spec, 100, owner=ALICE))
    assert admitted == NEAR - 1
    assert len(refused) == 100 - admitted and all(type(r) is OverShare for r in refused)


def test_near_the_bound_a_batch_over_its_share_is_refused_and_one_under_fills_the_bin(
    queue: Queue,
) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=100)
    admitted, _ = split(admit_many(queue, spec, NEAR, owner=ALICE))
    assert admitted == NEAR  # not near the bound until the last one is in
    admit(queue, spec, owner=BOB)
    admitted, refused = split(admit_many(queue, spec, 10, owner=ALICE))
    assert admitted == 0 and all(type(r) is OverShare for r in refused)
    # Bob is under his share: his batch fills the bin to its hard bound.
    admitted, refused = split(admit_many(queue, spec, 30, owner=BOB))
    assert admitted == 100 - NEAR - 1
    assert all(type(r) is BinFull for r in refused)
