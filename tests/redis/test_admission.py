"""Admission by predicted wait (admit.lua) on a real redis-server.

A drain rate is made the way workers make it: jobs claimed and completed, the
batch's claim time set back by its run time (as if it had run that long).
Draining ``n`` jobs in a batch of 1 s reads as about ``n`` jobs/s both ways (the
drain rate's minimum age is 1 s; the busy speed is n per second of batch) and
only falls while nothing else drains, so the bounds below hold however slowly
the test runs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from carpool.admission.fair_share import FAIR_SHARE_NEAR
from carpool.admission.retry_after import DRAIN_STALE_MS
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.errors import BinFull, OverShare, WaitTooLong
from carpool.core.jobs import JobStatus, Outcome
from carpool.core.shards import shard
from tests.support.jobs import admit

TTL_S = 60
#: Jobs drained to make a rate: about 10 jobs/s.
DRAINED = 10


def spec_with(max_queue_ms: int, max_depth: int = 1000, max_batch: int = 2) -> ModelSpec:
    spec = load_catalogue(None).get("synthetic")
    bins = tuple(replace(b, max_depth=max_depth, max_batch=max_batch) for b in spec.bins)
    return replace(spec, bins=bins, max_queue_ms=max_queue_ms)


def drain(q: Queue, spec: ModelSpec, n: int = DRAINED, batch_ms: int = 1000) -> None:
    for _ in range(n):
        admit(q, spec)
    claim = q.claim(spec, "small", n, lease_ms=5000, token="t", worker="w")
    assert len(claim.jobs) == n
    # The batch ran batch_ms: its claim (the claim hash holds the claim time).
    q.client.hset(q.keys.claim(shard(spec.name), "t"), "t", claim.now_ms - batch_ms)
    q.complete(spec, claim, [Outcome(j.id, result=1) for j in claim.jobs], {"size": n})


def queued(q: Queue, job_id: str) -> bool:
    view = q.get(job_id)
    return view is not None and view.status is JobStatus.QUEUED


def fill_until_refused(q: Queue, spec: ModelSpec, **kw: object) -> tuple[int, BinFull]:
    for admitted in range(spec.bins[0].max_depth + 1):
        try:
            admit(q, spec, **kw)
        except BinFull as exc:
            return admitted, exc
    raise AssertionError("never refused")


def test_a_job_predicted_to_start_after_max_queue_ms_is_refused_with_retry_after(
    queue: Queue,
) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    admitted, exc = fill_until_refused(queue, spec)
    # ~10 jobs/s for 1 s: about 10 jobs may wait, far below max_depth 1000.
    assert isinstance(exc, WaitTooLong)
    assert 2 <= admitted <= 2 * DRAINED
    assert exc.limit_ms == 1000 and exc.predicted_ms > 1000
    assert exc.retry_after_s >= 1


def test_a_job_with_its_own_deadline_is_measured_against_it(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    fill_until_refused(queue, spec)
    # A 60 s deadline is longer than the predicted wait: admitted although a job
    # without a deadline was just refused.
    assert queued(queue, admit(queue, spec, deadline_ms=60_000))
    # Jobs with a 4 s deadline are refused once they would end later than 70 % of it
    # (docs/admission.md), not once they would start later than 1 s.
    admitted, exc = fill_until_refused(queue, spec, deadline_ms=4000)
    assert isinstance(exc, WaitTooLong)
    assert exc.limit_ms == 2800 and exc.predicted_ms > 2800
    assert admitted > 2 * DRAINED  # more than max_queue_ms's 1 s lets in (see above)


def test_a_job_that_sorts_ahead_counts_only_the_jobs_ahead_of_it(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    fill_until_refused(queue, spec)
    # Priority 9 sorts before every queued priority-0 job: nothing is ahead of it.
    assert queued(queue, admit(queue, spec, priority=9))
    # More of them until one is refused: only the priority-9 jobs before it were counted.
    admitted, exc = fill_until_refused(queue, spec, priority=9)
    assert isinstance(exc, WaitTooLong)
    assert exc.depth == 1 + admitted


def test_a_burst_after_a_quiet_spell_is_judged_by_how_fast_workers_drain_when_busy(
    queue: Queue,
) -> None:
    # 10 jobs drained (about 10 jobs/s: the arrival rate of a quiet bin) in a batch
    # of 10 ms: a busy worker drains 1 000 jobs/s, so a 1 s wait holds ~1 000 jobs.
    spec = spec_with(max_queue_ms=1000, max_depth=200)
    drain(queue, spec, batch_ms=10)
    admitted, exc = fill_until_refused(queue, spec)
    assert admitted == 200 and not isinstance(exc, WaitTooLong)


def test_with_no_drain_rate_the_depth_bound_alone_holds(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1, max_depth=50)
    admitted, exc = fill_until_refused(queue, spec)
    assert admitted == 50 and not isinstance(exc, WaitTooLong)


def test_a_stale_drain_rate_falls_back_to_the_depth_bound(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000, max_depth=50)
    drain(queue, spec)
    # The last drain long ago: no worker serves this model now (scale from zero).
    for stats in (queue.keys.stats(spec.name, "small"), queue.keys.model_stats(spec.name)):
        last = int(queue.client.hget(stats, "rate_t"))  # type: ignore[arg-type]
        queue.client.hset(stats, mapping={"rate_t": last - DRAIN_STALE_MS - 1000,
                                          "rate_t0": last - DRAIN_STALE_MS - 2000})
    admitted, exc = fill_until_refused(queue, spec)
    assert admitted == 50 and not isinstance(exc, WaitTooLong)


def test_max_queue_ms_zero_turns_the_check_off(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=50)
    drain(queue, spec)
    admitted, exc = fill_until_refused(queue, spec)
    assert admitted == 50 and not isinstance(exc, WaitTooLong)


def test_a_bin_may_set_its_own_max_queue_ms(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=1000)
    spec = replace(spec, bins=(replace(spec.bins[0], max_queue_ms=1000), *spec.bins[1:]))
    drain(queue, spec)
    admitted, exc = fill_until_refused(queue, spec)
    assert isinstance(exc, WaitTooLong) and admitted <= 2 * DRAINED


@pytest.mark.parametrize("value", [-1])
def test_a_negative_max_queue_ms_is_a_config_error(value: int) -> None:
    from carpool.core.catalogue import validate
    from carpool.core.errors import ConfigError

    with pytest.raises(ConfigError, match="max_queue_ms"):
        validate(spec_with(max_queue_ms=value))


# Fair share between tenants: owners are API-key digests; max_queue_ms 0 leaves the
# depth bound alone, so "near the bound" is FAIR_SHARE_NEAR of max_depth.
ALICE, BOB = "a" * 64, "b" * 64
NEAR = int(FAIR_SHARE_NEAR * 100)


def test_near_the_bound_the_tenant_over_its_share_is_refused_first(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=100)
    for _ in range(NEAR):
        admit(queue, spec, owner=ALICE)
    admit(queue, spec, owner=BOB)  # under its share (nothing yet): admitted
    with pytest.raises(OverShare) as info:
        admit(queue, spec, owner=ALICE)
    assert info.value.retry_after_s >= 1
    # Bob stays under his half: admitted up to the hard bound, never refused for share.
    bob, exc = fill_until_refused(queue, spec, owner=BOB)
    assert bob == 100 - NEAR - 1 and type(exc) is BinFull


def test_a_lone_tenant_is_never_over_its_share(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=100)
    admitted, exc = fill_until_refused(queue, spec, owner=ALICE)
    assert admitted == 100 and type(exc) is BinFull


def test_a_heavier_weight_is_a_larger_share(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=100)
    for _ in range(NEAR):
        admit(queue, spec, owner=ALICE, owner_weight=99)
    admit(queue, spec, owner=BOB)
    with pytest.raises(OverShare):  # at weight 1 the same job would be over a 1/2 share
        admit(queue, spec, owner=ALICE)
    job = admit(queue, spec, owner=ALICE, owner_weight=99)  # 81/82 of the jobs, 99/100 share
    assert queued(queue, job)


def test_without_owners_there_is_no_share(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_depth=100)
    admitted, exc = fill_until_refused(queue, spec)
    assert admitted == 100 and type(exc) is BinFull
