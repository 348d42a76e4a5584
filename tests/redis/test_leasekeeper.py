"""The worker's lease keeper and suspect isolation, against a real Redis (no processes)."""

from __future__ import annotations

import pytest

from carpool.backend import records
from carpool.backend.audit import snapshot
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.jobs import JobStatus
from carpool.core.settings import Settings, load_settings
from tests.conftest import make_env
from tests.redis.test_leases import MAX_ATTEMPTS, bin_ids
from tests.support.jobs import admit, synthetic
from worker.loop.isolation import SuspectIsolation
from worker.loop.leasekeeper import LeaseKeeper

LEASE_MS = 60_000


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def leases(queue: Queue) -> Leases:
    return Leases(queue.client, queue.keys, load_catalogue(None))


@pytest.fixture
def worker_settings(redis_url: str, key_prefix: str) -> Settings:
    return load_settings(make_env(redis_url, key_prefix, CARPOOL_LEASE_MS=str(LEASE_MS),
                                  CARPOOL_MAX_BATCH_MS=str(10 * LEASE_MS)))


def lease_deadline(queue: Queue, job: str) -> float | None:
    """The deadline of the lease of the claim that holds ``job`` (one per claim)."""
    deadline = snapshot(queue.client, queue.keys, [synthetic().name]).leases.get(job)
    return None if deadline is None else float(deadline)


def test_keeper_renews_the_claims_in_hand_and_forgets_finished_ones(
        queue: Queue, leases: Leases, worker_settings: Settings) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=0, token="t", worker="w")  # lapsed
    keeper = LeaseKeeper(leases, worker_settings)
    keeper.hold(claim)
    keeper.tick()  # renews first, then reaps: the lease survives
    deadline = lease_deadline(queue, job)
    assert deadline is not None and deadline >= claim.now_ms + LEASE_MS
    keeper.finished(claim)
    assert keeper.hand_back_all(refund_attempt=True) == 0  # forgotten: nothing left to hand back


def test_keeper_hands_back_a_batch_that_ended_without_completing(
        queue: Queue, leases: Leases, worker_settings: Settings) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=LEASE_MS, token="t", worker="w")
    keeper = LeaseKeeper(leases, worker_settings)
    keeper.hold(claim)
    assert keeper.hand_back(claim, refund_attempt=False) == 1
    assert bin_ids(queue) == [job]
    record = records.read(queue.client, queue.keys.job(job)) or {}
    assert record.get("attempts") == "1"  # still counted


def test_keeper_lets_a_batch_over_max_batch_ms_lapse(
        queue: Queue, leases: Leases, worker_settings: Settings) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim = queue.claim(spec, "small", 8, lease_ms=0, token="t", worker="w")
    clock = FakeClock()
    keeper = LeaseKeeper(leases, worker_settings, clock=clock)
    keeper.hold(claim)
    clock.now_s += worker_settings.max_batch_ms / 1000.0 + 1
    keeper.tick()
    assert bin_ids(queue) == [job]  # not renewed: reaped in the same tick
    assert keeper.reclaimed_total == 1


def test_keeper_tells_of_a_batch_over_max_batch_ms_only_while_it_still_computes(
        queue: Queue, leases: Leases, worker_settings: Settings) -> None:
    spec = synthetic()
    admit(queue, spec, size=1)
    admit(queue, spec, size=100)
    hung = queue.claim(spec, "small", 8, lease_ms=LEASE_MS, token="t1", worker="w")
    written = queue.claim(spec, "medium", 8, lease_ms=LEASE_MS, token="t2", worker="w")
    clock = FakeClock()
    keeper = LeaseKeeper(leases, worker_settings, clock=clock)
    told: list[str] = []
    keeper.on_hung = lambda claim, ran_s: told.append(claim.token)
    keeper.hold(hung)
    keeper.hold(written)
    keeper.computed(written)  # its results in hand, Redis away: not a hang
    clock.now_s += worker_settings.max_batch_ms / 1000.0 + 1
    keeper.tick()
    keeper.tick()
    assert told == ["t1"]  # once


def test_keeper_reaps_other_workers_expired_leases_and_counts_the_dead(
        queue: Queue, leases: Leases, worker_settings: Settings) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    keeper = LeaseKeeper(leases, worker_settings)
    for _ in range(MAX_ATTEMPTS):
        queue.claim(spec, "small", 8, lease_ms=0, token="dead", worker="other")
        keeper.tick()
    assert (keeper.reclaimed_total, keeper.dead_total) == (MAX_ATTEMPTS, 1)
    assert queue.get(job).status is JobStatus.FAILED  # type: ignore[union-attr]


def test_keeper_tells_the_metrics_how_many_leases_it_took_back(
        queue: Queue, leases: Leases, worker_settings: Settings) -> None:
    spec = synthetic()
    for i in range(3):
        admit(queue, spec, value=i)
    queue.claim(spec, "small", 8, lease_ms=0, token="dead", worker="other")
    told: list[int] = []
    keeper = LeaseKeeper(leases, worker_settings)
    keeper.on_reclaimed = told.append
    keeper.tick()
    keeper.tick()  # nothing left to take back: not told again
    assert told == [3]


def test_keeper_hand_back_releases_every_claim_in_hand(
        queue: Queue, leases: Leases, worker_settings: Settings) -> None:
    spec = synthetic()
    jobs = [admit(queue, spec, value=i) for i in range(3)]
    claim = queue.claim(spec, "small", 8, lease_ms=LEASE_MS, token="t", worker="w")
    keeper = LeaseKeeper(leases, worker_settings)
    keeper.hold(claim)
    assert keeper.hand_back_all(refund_attempt=True) == 3
    assert bin_ids(queue) == jobs
    assert keeper.hand_back_all(refund_attempt=True) == 0  # none left in hand


def lose(queue: Queue, leases: Leases, spec: ModelSpec, token: str) -> None:
    """The bin's head job is claimed by a worker that dies: its lease lapses, reaped."""
    queue.claim(spec, "small", 1, lease_ms=0, token=token, worker="w")
    leases.reap(MAX_ATTEMPTS)


def test_a_batch_whose_worker_died_once_is_retried_whole(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    a, b, c = (admit(queue, spec, value=i) for i in range(3))
    lose(queue, leases, spec, "lost")
    claim = queue.claim(spec, "small", 8, lease_ms=LEASE_MS, token="t", worker="w")
    assert [(j.id, j.attempts) for j in claim.jobs] == [(a, 2), (b, 1), (c, 1)]
    assert SuspectIsolation(leases, MAX_ATTEMPTS)(claim) == claim


def test_isolation_runs_a_job_that_lost_its_worker_twice_alone_and_hands_back_the_rest(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    a, b, c = (admit(queue, spec, value=i) for i in range(3))
    lose(queue, leases, spec, "lost")
    lose(queue, leases, spec, "lost-again")
    claim = queue.claim(spec, "small", 8, lease_ms=LEASE_MS, token="t", worker="w")
    assert [(j.id, j.attempts) for j in claim.jobs] == [(a, 3), (b, 1), (c, 1)]
    narrowed = SuspectIsolation(leases, MAX_ATTEMPTS)(claim)
    assert [j.id for j in narrowed.jobs] == [a]
    assert bin_ids(queue) == [b, c]
    again = queue.claim(spec, "small", 8, lease_ms=LEASE_MS, token="t2", worker="w")
    assert [j.attempts for j in again.jobs] == [1, 1]  # their attempt was refunded
    assert SuspectIsolation(leases, MAX_ATTEMPTS)(again) == again  # no suspect: whole


def test_with_two_attempts_a_jobs_last_attempt_runs_alone(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    a, b = (admit(queue, spec, value=i) for i in range(2))
    lose(queue, leases, spec, "lost")
    claim = queue.claim(spec, "small", 8, lease_ms=LEASE_MS, token="t", worker="w")
    assert [j.id for j in SuspectIsolation(leases, max_attempts=2)(claim).jobs] == [a]
