"""renew.lua, reap.lua, release.lua and the one-place audit, on a real redis-server.

A claim made with ``lease_ms=0`` has expired the moment it is made (its deadline is
Redis's "now"), so reaping is tested without waiting for a clock.
"""

from __future__ import annotations

import threading

import pytest

from carpool.backend import records
from carpool.backend.audit import snapshot, violations
from carpool.backend.connection import connect
from carpool.backend.keys import Keys, shard
from carpool.backend.leases import Leases, claim_token
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.jobs import JobStatus, Outcome
from tests.support.jobs import admit, synthetic

MAX_ATTEMPTS = 3


@pytest.fixture
def leases(queue: Queue) -> Leases:
    return Leases(queue.client, queue.keys, load_catalogue(None))


def claim(queue: Queue, spec: ModelSpec, n: int = 8, *, lease_ms: int = 0, token: str = "t",
          worker: str = "w") -> list[str]:
    got = queue.claim(spec, "small", n, lease_ms=lease_ms, token=token, worker=worker)
    return [j.id for j in got.jobs]


def bin_ids(queue: Queue) -> list[str]:
    return list(queue.client.zrange(queue.keys.bin("synthetic", "small"), 0, -1))


def assert_one_place(queue: Queue, admitted: list[str]) -> None:
    assert violations(snapshot(queue.client, queue.keys, ["synthetic"]), admitted) == []


def test_an_expired_lease_goes_back_to_its_place_at_the_front_of_its_bin(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    first = [admit(queue, spec, value=i) for i in range(3)]
    later = admit(queue, spec, value="later")
    assert claim(queue, spec, 3) == first
    report = leases.reap(MAX_ATTEMPTS)
    assert (report.requeued, report.failed, report.dropped) == (3, 0, 0)
    assert bin_ids(queue) == [*first, later]  # under its stored score: its old place
    view = queue.get(first[0])
    assert view is not None and view.status is JobStatus.QUEUED
    assert_one_place(queue, [*first, later])


def test_a_reaped_job_is_claimed_again_with_its_attempts_counted(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim(queue, spec)
    leases.reap(MAX_ATTEMPTS)
    again = queue.claim(spec, "small", 8, lease_ms=5000, token="t2", worker="w2")
    assert [(j.id, j.attempts) for j in again.jobs] == [(job, 2)]


def test_a_live_lease_is_left_alone(queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim(queue, spec, lease_ms=60_000)
    assert leases.reap(MAX_ATTEMPTS).reclaimed == 0
    assert queue.get(job).status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_a_job_lost_max_attempts_times_fails_with_a_reason_and_goes_on_the_dead_list(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        claim(queue, spec, worker=f"w{attempt}")
        report = leases.reap(MAX_ATTEMPTS)
    assert (report.requeued, report.failed) == (0, 1)
    view = queue.get(job)
    assert view is not None and view.status is JobStatus.FAILED
    assert view.error is not None and "worker lost 3 times" in view.error and "w3" in view.error
    record = records.read(queue.client, queue.keys.job(job)) or {}
    assert record.get("t_claim") is not None  # its last claim's, as a result has it
    assert "batch" not in record  # it never completed one: the error names the worker
    assert '"size"' not in (queue.client.get(queue.keys.job(job)) or "")  # the input went
    assert leases.dead_letters() == [job]
    assert bin_ids(queue) == []
    assert queue.client.ttl(queue.keys.job(job)) <= spec.result_ttl_s
    assert_one_place(queue, [job])


def test_reaping_wakes_the_models_workers(queue: Queue, leases: Leases) -> None:
    spec = synthetic(max_batch=2)
    admit(queue, spec)
    queue.client.delete(queue.keys.wake("synthetic"))
    claim(queue, spec)
    leases.reap(MAX_ATTEMPTS)
    assert queue.client.lrange(queue.keys.wake("synthetic"), 0, -1) == ["small"]


def test_concurrent_reapers_take_each_expired_lease_back_exactly_once(
        queue: Queue, redis_url: str) -> None:
    spec = synthetic()
    jobs = [admit(queue, spec, value=i) for i in range(200)]
    claim(queue, spec, 200)
    reports = []
    lock = threading.Lock()

    def reap() -> None:
        mine = Leases(connect(redis_url), queue.keys, load_catalogue(None))
        for _ in range(20):
            r = mine.reap(MAX_ATTEMPTS, limit=7)
            with lock:
                reports.append(r)

    threads = [threading.Thread(target=reap) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.requeued for r in reports) == 200
    assert sorted(bin_ids(queue)) == sorted(jobs)
    assert_one_place(queue, jobs)


def test_renewal_keeps_a_lease_the_claim_holds(queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim(queue, spec, token="mine")  # expired at once, unless renewed
    assert leases.renew("mine", [job], 60_000) == [True]
    assert leases.reap(MAX_ATTEMPTS).reclaimed == 0
    assert queue.get(job).status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_renewal_under_another_token_or_after_a_reap_is_refused(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim(queue, spec, token="mine")
    assert leases.renew("not-mine", [job], 60_000) == [False]
    leases.reap(MAX_ATTEMPTS)
    assert leases.renew("mine", [job], 60_000) == [False]
    assert queue.client.zrange(queue.keys.leases(shard("synthetic")), 0, -1) == []
    assert not queue.client.exists(queue.keys.claim(shard("synthetic"), "mine"))


def test_a_zombie_cannot_complete_a_job_reclaimed_by_another_worker(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    zombie = queue.claim(spec, "small", 8, lease_ms=0, token="zombie", worker="w1")
    leases.reap(MAX_ATTEMPTS)
    second = queue.claim(spec, "small", 8, lease_ms=60_000, token="second", worker="w2")
    assert queue.complete(
        spec, second, [Outcome(job, result="second")], {"size": 1}).written == [True]
    assert queue.complete(
        spec, zombie, [Outcome(job, result="zombie")], {"size": 1}).written == [False]
    view = queue.get(job)
    assert view is not None and view.result == "second"


def test_release_hands_jobs_back_in_claim_order_and_refunds_the_attempt(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    jobs = [admit(queue, spec, value=i) for i in range(4)]
    held = claim(queue, spec, 3, lease_ms=60_000, token="mine")
    assert leases.release("mine", held, refund_attempt=True) == [True] * 3
    assert bin_ids(queue) == jobs
    again = queue.claim(spec, "small", 1, lease_ms=60_000, token="t2", worker="w")
    assert again.jobs[0].attempts == 1
    assert_one_place(queue, jobs)


def test_a_handed_back_or_reaped_job_keeps_its_urgency_among_jobs_admitted_since(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    released = admit(queue, spec, value="released")
    reaped = admit(queue, spec, value="reaped")
    claim(queue, spec, 1, lease_ms=60_000, token="mine")
    claim(queue, spec, 1, lease_ms=0, token="lost")
    urgent = admit(queue, spec, value="urgent", priority=9)
    later = admit(queue, spec, value="later")
    assert leases.release("mine", [released], refund_attempt=True) == [True]
    assert leases.reap(MAX_ATTEMPTS).requeued == 1
    assert bin_ids(queue) == [urgent, released, reaped, later]
    assert_one_place(queue, [released, reaped, urgent, later])


def test_release_without_refund_keeps_the_attempt_counted(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    claim(queue, spec, lease_ms=60_000, token="mine")
    leases.release("mine", [job], refund_attempt=False)
    assert (records.read(queue.client, queue.keys.job(job)) or {}).get("attempts") == "1"


def test_release_leaves_finished_and_foreign_jobs_untouched(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    a, b = admit(queue, spec), admit(queue, spec)
    got = queue.claim(spec, "small", 2, lease_ms=60_000, token="mine", worker="w")
    queue.complete(spec, got, [Outcome(a, result=1)], {"size": 1})
    assert leases.release("other", [b], refund_attempt=True) == [False]
    assert leases.release("mine", [a, b], refund_attempt=True) == [False, True]
    assert queue.get(a).status is JobStatus.DONE  # type: ignore[union-attr]
    assert bin_ids(queue) == [b]


def test_audit_flags_a_job_in_two_places_and_a_lost_one(queue: Queue) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    queue.client.zadd(queue.keys.bin("synthetic", "large"), {job: 0})  # a duplicate, by hand
    found = violations(snapshot(queue.client, queue.keys, ["synthetic"]), [job, "A" * 26])
    assert any("queued, in 2 bin slots" in v for v in found)
    assert any("lost" in v for v in found)


def test_audit_ignores_other_prefixes(queue: Queue, keys: Keys) -> None:
    spec = synthetic()
    job = admit(queue, spec)
    other = Queue(queue.client, Keys(keys.prefix + "-other"))
    try:
        admit(other, spec)
        assert list(snapshot(queue.client, keys, ["synthetic"]).status) == [job]
    finally:
        queue.client.delete(*queue.client.keys(other.keys.job_pattern(shard("synthetic"))),
                            other.keys.bin("synthetic", "small"),
                            other.keys.wake("synthetic"))



def test_a_claim_holds_one_lease_for_all_its_jobs_until_its_last_job_ends(
        queue: Queue, leases: Leases) -> None:
    """Lease work is per claim, not per job: one zset entry, renewed in one step; it
    goes with the claim's last job, whichever way the jobs leave (release, complete)."""
    spec = synthetic()
    admitted = [admit(queue, spec, value=i) for i in range(6)]
    running = queue.claim(spec, "small", 6, lease_ms=60_000, token="big", worker="w")
    ids = [j.id for j in running.jobs]
    tag = shard("synthetic")
    assert queue.client.zrange(queue.keys.leases(tag), 0, -1) == ["big"]
    held = set(queue.client.hkeys(queue.keys.claim(tag, "big"))) - {"t", "w"}
    assert held == set(ids)
    before = queue.client.zscore(queue.keys.leases(tag), "big")
    assert leases.renew("big", ids, 120_000) == [True] * 6
    assert queue.client.zcard(queue.keys.leases(tag)) == 1
    assert queue.client.zscore(queue.keys.leases(tag), "big") > before

    assert leases.release("big", ids[:2], refund_attempt=True) == [True, True]
    assert leases.renew("big", ids, 60_000) == [False, False] + [True] * 4
    outcomes = [Outcome(i, result={"ok": 1}) for i in ids[2:]]
    assert queue.complete(spec, running, outcomes[:3], {"size": 3}).written == [True] * 3
    assert queue.client.zrange(queue.keys.leases(tag), 0, -1) == ["big"]  # one job left
    assert queue.complete(spec, running, outcomes[3:], {"size": 1}).written == [True]
    assert queue.client.zcard(queue.keys.leases(tag)) == 0
    assert not queue.client.exists(queue.keys.claim(tag, "big"))
    assert queue.complete(spec, running, outcomes[3:], {"size": 1}).written == [False]  # once only
    assert_one_place(queue, admitted)


def test_a_record_gone_while_claimed_is_not_written_back_as_a_partial_record(
        queue: Queue) -> None:
    """An evicting maxmemory policy or a key deleted by hand: the completion refuses that
    job (a record without its admission would break every later read) and the others'
    results are written; the claim ends with its last job all the same."""
    spec = synthetic()
    ids = [admit(queue, spec, value=i) for i in range(3)]
    claimed = queue.claim(spec, "small", 3, lease_ms=60_000, token="gone", worker="w")
    queue.client.delete(queue.keys.job(ids[1]))
    outcomes = [Outcome(i, result=i) for i in ids]
    assert queue.complete(spec, claimed, outcomes, {"size": 3}).written == [True, False, True]
    assert not queue.client.exists(queue.keys.job(ids[1]))
    assert [v.status if v else None for v in queue.get_many(ids)] == [
        JobStatus.DONE, None, JobStatus.DONE]
    assert not queue.client.exists(queue.keys.claim(shard("synthetic"), "gone"))
    assert queue.client.zcard(queue.keys.leases(shard("synthetic"))) == 0


def test_the_audit_finds_a_job_held_by_two_claims(queue: Queue) -> None:
    spec = synthetic()
    [job] = [admit(queue, spec)]
    claim(queue, spec, 1, lease_ms=60_000, token="one")
    tag = shard("synthetic")
    queue.client.hset(queue.keys.claim(tag, "two"), mapping={"t": "0", "w": "x", job: "1"})
    queue.client.zadd(queue.keys.leases(tag), {"two": 1})
    assert violations(snapshot(queue.client, queue.keys, ["synthetic"]), [job]) == [
        f"{job}: held by more than one claim"]


def test_a_worker_restarted_under_a_name_ends_only_that_names_leases(
        queue: Queue, leases: Leases) -> None:
    spec = synthetic()
    mine = [admit(queue, spec, value=i) for i in range(2)]
    queue.claim(spec, "small", 2, lease_ms=600_000, token=claim_token("w1@h", 1), worker="w1@h")
    theirs = [admit(queue, spec, value=i) for i in range(2, 4)]
    queue.claim(spec, "small", 2, lease_ms=600_000, token=claim_token("w10@h", 1),
                worker="w10@h")
    assert leases.end_leases_of("w1@h") == 1
    leases.reap(MAX_ATTEMPTS)
    assert bin_ids(queue) == mine  # back at the front, the other worker's still held
    assert leases.end_leases_of("w1@h") == 0
    assert all(j not in bin_ids(queue) for j in theirs)
