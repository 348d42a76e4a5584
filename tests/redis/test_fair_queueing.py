"""Fair queueing between tenants within a bin (admit.lua) on a real redis-server.

Each owner (API-key digest) has a virtual clock per bin: a job sorts later by how far
its owner's clock leads now, and the clock advances by one job's service time at the
owner's fair rate. With a drain rate of ~10 jobs/s (``drain``), one job of a lone
owner moves its clock ~100 ms, of one of two active owners ~200 ms; the assertions
below hold whatever the machine's speed as long as admitting the backlog takes less
than that backlog's lead (a second or more).
"""

from __future__ import annotations

import pytest

from carpool.admission.urgency import sort_offset_ms
from carpool.backend import records
from carpool.backend.queue import Queue
from carpool.core.errors import OverShare, WaitTooLong
from tests.redis.test_admission import drain, fill_until_refused, spec_with
from tests.redis.test_admission_many import admit_many, split
from tests.support.jobs import admit

ALICE, BOB = "a" * 64, "b" * 64
#: Alice's backlog: ~1.5 s of her virtual clock at ~10 jobs/s.
BACKLOG = 16


def ranks(queue: Queue, spec_name: str) -> list[str]:
    return queue.client.zrange(queue.keys.bin(spec_name, "small"), 0, -1)  # type: ignore[return-value]


def shift_ms(queue: Queue, job_id: str, offset_ms: int) -> float:
    """How much later the job sorts than its plain urgency (admission + offset)."""
    h = records.read(queue.client, queue.keys.job(job_id)) or {}
    return (float(h["score"]) - (int(h["t_admit"]) + offset_ms) * 1000) / 1000


def test_a_flooding_keys_backlog_does_not_delay_a_quiet_keys_new_job(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec)
    flood = [admit(queue, spec, owner=ALICE) for _ in range(BACKLOG)]
    quiet = admit(queue, spec, owner=BOB)
    order = ranks(queue, spec.name)
    # Bob's job goes before all of Alice's backlog but the few whose turn has come
    # (the first batch, admitted at once, and those within the time admitting took).
    assert order.index(quiet) <= 4, order.index(quiet)
    assert [j for j in order if j != quiet] == flood


def test_order_within_a_key_is_unchanged(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec)
    backlog = [admit(queue, spec, owner=ALICE) for _ in range(BACKLOG)]
    urgent = admit(queue, spec, owner=ALICE, priority=9)
    due = admit(queue, spec, owner=ALICE, deadline_ms=60_000)
    # Her clock did move her later jobs back (this is the order under fair queueing) ...
    assert shift_ms(queue, backlog[-1], spec.max_deadline_ms) > 500
    # ... yet her own jobs keep their urgency order: deadline first (never sorted past
    # it), then priority 9, then the rest first-in, first-out.
    assert ranks(queue, spec.name)[-len(backlog) - 2:] == [due, urgent, *backlog]
    assert shift_ms(queue, due, sort_offset_ms(spec, 60_000, 0)) < 1  # t_admit is in ms


def test_without_keys_the_order_and_score_are_unchanged(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec)
    jobs = [admit(queue, spec) for _ in range(BACKLOG)]
    assert ranks(queue, spec.name) == jobs
    # The plain urgency to the µs: Redis's admission time (ms in t_admit) + the offset.
    assert all(0 <= shift_ms(queue, j, spec.max_deadline_ms) < 1 for j in jobs)
    assert not queue.client.exists(queue.keys.tenants(spec.name, "small"))


def test_the_flood_is_refused_by_its_own_predicted_wait_and_the_quiet_key_admitted(
    queue: Queue,
) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    _, exc = fill_until_refused(queue, spec, owner=ALICE)
    assert isinstance(exc, WaitTooLong) and exc.retry_after_s >= 1
    # Only the few of Alice's jobs whose turn has come sort ahead of Bob's: admitted.
    for _ in range(3):
        admit(queue, spec, owner=BOB)


def test_a_job_whose_turn_comes_after_its_deadline_is_refused_not_admitted_to_miss_it(
    queue: Queue,
) -> None:
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec)
    for _ in range(BACKLOG):
        admit(queue, spec, owner=ALICE)
    # Alice's clock leads by ~1.5 s: a 500 ms deadline would pass before her turn.
    with pytest.raises(WaitTooLong) as info:
        admit(queue, spec, owner=ALICE, deadline_ms=500)
    assert info.value.limit_ms == 500 and info.value.retry_after_s >= 1
    admit(queue, spec, owner=BOB, deadline_ms=500)  # Bob's clock is at now


def test_a_quiet_keys_past_admissions_do_not_make_it_over_its_share(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    # Bob admitted 100 jobs in the last moments, all served since: nothing of his queued.
    now_ms = int(queue.client.hget(queue.keys.stats(spec.name, "small"), "rate_t"))  # type: ignore[arg-type]
    queue.client.hset(queue.keys.tenants(spec.name, "small"), BOB, f"100 {now_ms} 1 0")
    # Alice floods: near the bound she holds more than her half of it.
    _, exc = fill_until_refused(queue, spec, owner=ALICE)
    admit(queue, spec, owner=BOB)  # not over his share: his clock is at now
    assert isinstance(exc, OverShare) and exc.retry_after_s >= 1


def test_a_heavier_weight_moves_its_clock_less_per_job(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec)
    heavy, light = [], []
    for _ in range(BACKLOG // 2):
        heavy.append(admit(queue, spec, owner=ALICE, owner_weight=3))
        light.append(admit(queue, spec, owner=BOB))
    # Both active: per job, Alice's clock moves 4/3 of a job's time, Bob's 4 of them.
    off = spec.max_deadline_ms
    assert shift_ms(queue, light[-1], off) > 2 * shift_ms(queue, heavy[-1], off) > 0


def test_a_clock_behind_now_restarts_at_now_and_its_lead_is_capped(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    for _ in range(2):  # past the first batch: the clock is read
        admit(queue, spec)
    tenants = queue.keys.tenants(spec.name, "small")
    now_ms = int(queue.client.hget(queue.keys.stats(spec.name, "small"), "rate_t"))  # type: ignore[arg-type]
    queue.client.hset(tenants, ALICE, f"1 {now_ms} 1 {(now_ms - 60_000) * 1000}")
    idle = admit(queue, spec, owner=ALICE, deadline_ms=60_000, priority=9)
    assert 0 <= shift_ms(queue, idle, sort_offset_ms(spec, 60_000, 9)) < 1  # µs of t_admit
    queue.client.hset(tenants, ALICE, f"1 {now_ms} 1 {(now_ms + 3_600_000) * 1000}")
    ahead = admit(queue, spec, owner=ALICE, deadline_ms=60_000, priority=9)
    # Capped at 2 × max_queue_ms (FAIR_LEAD_QUEUE_FACTOR), not the hour it led by.
    assert 2000 <= shift_ms(queue, ahead, sort_offset_ms(spec, 60_000, 9)) < 2001


def test_a_batch_moves_its_owners_clock_job_by_job_and_stores_it_once(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec)
    admitted, refused = split(admit_many(queue, spec, BACKLOG, owner=ALICE))
    assert admitted == BACKLOG and not refused
    batch = ranks(queue, spec.name)
    quiet = admit(queue, spec, owner=BOB)
    order = ranks(queue, spec.name)
    # As for single jobs: Bob's job goes before Alice's batch but its first few.
    assert order.index(quiet) <= 4, order.index(quiet)
    assert [j for j in order if j != quiet] == batch
    # Past the first batch (max_batch 2) each job of the call sorts one job's time at
    # her fair rate (~100 ms) behind the one before ...
    shifts = [shift_ms(queue, j, spec.max_deadline_ms) for j in batch]
    steps = [b - a for a, b in zip(shifts[2:-1], shifts[3:], strict=True)]
    assert min(steps) > 50, steps
    # ... and her clock, written once, stands one more step past the call's last job.
    last = records.read(queue.client, queue.keys.job(batch[-1])) or {}
    entry = queue.client.hget(queue.keys.tenants(spec.name, "small"), ALICE)
    clock_ms = float(entry.split()[3]) / 1000  # type: ignore[union-attr]
    assert abs(clock_ms - int(last["t_admit"]) - shifts[-1] - steps[-1]) < 0.1


def test_in_a_batch_each_job_counts_the_jobs_ahead_of_its_own_place(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drain(queue, spec)
    flood, exc = fill_until_refused(queue, spec, owner=ALICE)
    assert isinstance(exc, WaitTooLong)
    # Every one of Alice's jobs sorts ahead of a job at Bob's plain urgency, so without
    # fair queueing his first job would be refused: his clock is at now, so only the
    # few of hers whose turn has come are ahead of it.
    admitted, refused = split(admit_many(queue, spec, 20, owner=BOB))
    assert admitted >= 2, (admitted, flood)
    first = refused[0]
    assert isinstance(first, WaitTooLong)
    # Bob's later jobs sort later by his clock: ahead of the first one refused are the
    # call's own earlier jobs and at least the jobs of Alice ahead of his last admitted.
    order = ranks(queue, spec.name)
    bobs = [j for j in order
            if (records.read(queue.client, queue.keys.job(j)) or {}).get("owner") == BOB]
    assert len(bobs) == admitted
    alice_ahead = order.index(bobs[-1]) - (admitted - 1)
    assert first.depth >= admitted + alice_ahead, (first.depth, admitted, alice_ahead)


def test_an_owner_idle_for_long_is_dropped_from_the_tenants_hash(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec)
    tenants = queue.keys.tenants(spec.name, "small")
    queue.client.hset(tenants, BOB, "0.001 1000 1 5")  # decayed away, clock long past
    for _ in range(3):  # past the first batch: the whole hash is read
        admit(queue, spec, owner=ALICE)
    assert queue.client.hkeys(tenants) == [ALICE]
