"""Admission by predicted wait across a model's bins (admit.lua), on a real redis-server.

One worker serves every bin of its model, so a job's predicted start counts the
model's jobs ahead of it in every bin, at the model's pace (complete.lua sums the
drain and busy time of all the model's bins). A drain is made the way workers make
it, as in test_admission.py: jobs claimed and completed, the claim time set back by
the batch's run time.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from carpool.backend import records, replies
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.catalogue import BinSpec, ModelSpec, load_catalogue
from carpool.core.errors import BinFull, WaitTooLong
from carpool.core.jobs import Outcome, new_job_id
from carpool.core.shards import shard

TTL_S = 60
#: Jobs drained to make a pace: about 10 jobs/s.
DRAINED = 10


def spec_with(max_queue_ms: int, max_batch: int = 2) -> ModelSpec:
    spec = load_catalogue(None).get("synthetic")
    bins = tuple(replace(b, max_depth=1000, max_batch=max_batch) for b in spec.bins)
    return replace(spec, bins=bins, max_queue_ms=max_queue_ms)


def admit(q: Queue, spec: ModelSpec, bin_spec: BinSpec, **kw: object) -> str:
    body = json.dumps({"value": 0, "size": 1})
    return single_admitted(Admissions(q.client, q.keys).admit(AdmitRequest(
        spec, (AdmitJob(bin_spec, new_job_id(spec.name), body),),
        queued_ttl_s=TTL_S, **kw))).id  # type: ignore[arg-type]


def drain(q: Queue, spec: ModelSpec, bin_spec: BinSpec, n: int = DRAINED,
          batch_ms: int = 1000, waited_ms: int = 0, busy_ms: int = 0,
          deadline_ms: int = 0, priority: int = 0, runs_before: int = 0) -> None:
    """``n`` jobs admitted, claimed as one batch that ran ``batch_ms``, completed; each
    admitted ``waited_ms`` before the claim (on Redis's clock), with ``deadline_ms`` (0:
    none) from then, at ``priority``, after ``runs_before`` runs lost; ``busy_ms``: the
    part of the batch its worker gave it alone (0: all of it)."""
    ids = [admit(q, spec, bin_spec, deadline_ms=deadline_ms, priority=priority)
           for _ in range(n)]
    if waited_ms or runs_before:
        seconds, micros = q.client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        for job_id in ids:
            shifted: dict[str, int] = {"t_admit": now_ms - waited_ms}
            if deadline_ms:
                shifted["deadline"] = now_ms - waited_ms + deadline_ms
            if runs_before:
                shifted["attempts"] = runs_before
            records.update(q.client, q.keys.job(job_id), **shifted)
    token = f"t-{bin_spec.name}"
    claim = q.claim(spec, bin_spec.name, n, lease_ms=5000, token=token, worker="w")
    assert len(claim.jobs) == n
    q.client.hset(q.keys.claim(shard(spec.name), token), "t", claim.now_ms - batch_ms)
    q.complete(spec, claim, [Outcome(j.id, result=1) for j in claim.jobs], {"size": n},
               busy_ms=busy_ms)


def fill_until_refused(q: Queue, spec: ModelSpec, bin_spec: BinSpec,
                       **kw: object) -> tuple[int, BinFull]:
    for admitted in range(bin_spec.max_depth + 1):
        try:
            admit(q, spec, bin_spec, **kw)
        except BinFull as exc:
            return admitted, exc
    raise AssertionError("never refused")


def test_jobs_waiting_in_the_models_other_bins_count_against_a_new_jobs_wait(
    queue: Queue,
) -> None:
    spec = spec_with(max_queue_ms=1000)
    small, medium = spec.bins[0], spec.bins[1]
    drain(queue, spec, small)
    # The medium bin fills to about a second of the model's work ...
    admitted, exc = fill_until_refused(queue, spec, medium)
    assert isinstance(exc, WaitTooLong) and admitted >= 2
    # ... so a job into the empty small bin would wait behind it: refused, though its
    # own bin holds nothing (a per-bin rule admits it: less than a batch is queued).
    with pytest.raises(WaitTooLong) as refused:
        admit(queue, spec, small)
    assert refused.value.predicted_ms > 1000


def test_the_pace_is_summed_over_the_models_bins(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    small, medium = spec.bins[0], spec.bins[1]
    drain(queue, spec, small)
    drain(queue, spec, medium)
    model_stats = queue.keys.model_stats(spec.name)
    stats = queue.client.hgetall(model_stats)
    assert float(stats["rate_c"]) == pytest.approx(2 * DRAINED, rel=0.01)
    assert float(stats["busy_c"]) == pytest.approx(2000, rel=0.05)
    # One worker ran the two 1 s batches one after the other: the first drain was 2 s
    # ago. Each bin alone drained 10 jobs per second of its own batches, but the model
    # drained 20 in 2 s: about 10 jobs/s in all, so a second of wait is about 10 jobs
    # across both bins, not 10 in each.
    first_ms = int(stats["rate_t"]) - 2000
    for key in (model_stats, *(queue.keys.stats(spec.name, b.name) for b in (small, medium))):
        queue.client.hset(key, "rate_t0", first_ms)
    first, _ = fill_until_refused(queue, spec, small)
    second, _ = fill_until_refused(queue, spec, medium)
    assert first + second <= DRAINED + 4


def drained_two_bins_at_different_costs(queue: Queue, spec: ModelSpec) -> None:
    """Small: 10 jobs in 1 s (100 ms each); medium: 2 jobs in 1 s (500 ms each); one
    after the other, 2 s ago: the model drains 12 jobs in 2 s, about 167 ms each."""
    small, medium = spec.bins[0], spec.bins[1]
    drain(queue, spec, small)
    drain(queue, spec, medium, n=2)
    model_stats = queue.keys.model_stats(spec.name)
    first_ms = int(queue.client.hget(model_stats, "rate_t") or 0) - 2000
    for key in (model_stats, *(queue.keys.stats(spec.name, b.name) for b in (small, medium))):
        queue.client.hset(key, "rate_t0", first_ms)


def test_jobs_of_a_dear_bin_count_for_more_of_the_predicted_wait(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drained_two_bins_at_different_costs(queue, spec)
    # A second of the model's work is about 6.6 average jobs: 2 of medium's (3 each),
    # where counting jobs alike would take 6.
    admitted, exc = fill_until_refused(queue, spec, spec.bins[1])
    assert isinstance(exc, WaitTooLong) and 2 <= admitted <= 4


def test_jobs_of_a_cheap_bin_count_for_less_of_the_predicted_wait(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    drained_two_bins_at_different_costs(queue, spec)
    # Small's jobs cost 0.6 of an average one: about 11 fit in a second, not 6.
    admitted, exc = fill_until_refused(queue, spec, spec.bins[0])
    assert isinstance(exc, WaitTooLong) and admitted >= 9


def test_a_job_that_sorts_ahead_counts_no_later_job_of_another_bin(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    small, medium = spec.bins[0], spec.bins[1]
    drain(queue, spec, small)
    fill_until_refused(queue, spec, medium)
    # Priority 9 sorts before every queued priority-0 job, in its bin and in the others.
    admit(queue, spec, small, priority=9)


def test_with_no_pace_yet_a_bin_takes_jobs_up_to_its_depth_whatever_the_other_bins_hold(
    queue: Queue,
) -> None:
    spec = spec_with(max_queue_ms=1000)
    small, medium = spec.bins[0], spec.bins[1]
    for _ in range(50):  # no worker has drained the model yet: depth alone
        admit(queue, spec, medium)
    for _ in range(50):
        admit(queue, spec, small)
    assert queue.client.zcard(queue.keys.bin(spec.name, small.name)) == 50


def test_a_pipelined_workers_overlapping_batches_count_their_busy_time_once(
        queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    small, medium = spec.bins[0], spec.bins[1]
    # A worker with two batches in flight: each was claimed 1 s before its completion,
    # but the second ran its first half while the first computed, so the worker was
    # busy 1.5 s, not 2 s; then idle: the first drain was 2.5 s ago.
    drain(queue, spec, small)
    drain(queue, spec, medium, busy_ms=500)
    model_stats = queue.keys.model_stats(spec.name)
    stats = queue.client.hgetall(model_stats)
    assert float(stats["busy_c"]) == pytest.approx(1500, rel=0.05)
    queue.client.hset(model_stats, "rate_t0", int(stats["rate_t"]) - 2500)
    # Busy 60 % of the time, not saturated: the pace is its busy speed, 20 jobs in
    # 1.5 s (about 13 a second), not the drain rate of a window with idle time in it
    # (about 9 a second), which counting the overlap twice (80 % busy) would give.
    # Small's jobs took 100 ms each of busy time and medium's 50, against 75 on
    # average: they count 4/3 and 2/3 of an average job.
    first, _ = fill_until_refused(queue, spec, small)
    second, _ = fill_until_refused(queue, spec, medium)
    assert first * 4 / 3 + second * 2 / 3 >= 12


def test_jobs_that_started_later_than_their_wait_allowed_slow_the_pace(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=1000)
    small = spec.bins[0]
    # The same drain as above, but every job of it waited 5 s, past its 1 s bound:
    # the pace that let them in was too fast.
    drain(queue, spec, small, waited_ms=5000)
    stats = queue.client.hgetall(queue.keys.model_stats(spec.name))
    assert float(stats["late_c"]) == pytest.approx(DRAINED, rel=0.01)
    # Half of the recent jobs started late: about half the ~10 jobs a second holds.
    admitted, exc = fill_until_refused(queue, spec, small)
    assert isinstance(exc, WaitTooLong)
    assert admitted <= DRAINED // 2 + 2


@pytest.mark.parametrize(("waited_ms", "priority", "runs_before", "late"), [
    (8_000, 0, 0, DRAINED),  # started past 7 s, still before the deadline: late
    (6_000, 0, 0, 0),  # within the admitted end
    (8_000, -1, 0, 0),  # a bulk line waits behind interactive work by design
    (8_000, 0, 1, 0),  # a run again: its wait holds the lease it lost
])
def test_jobs_that_started_past_their_admitted_end_count_late_before_their_deadline(
        queue: Queue, waited_ms: int, priority: int, runs_before: int, late: int) -> None:
    # A 10 s deadline: admitted only if predicted to end by 7 s (admit.lua's share).
    # A first run that starts past it shows the prediction wrong by a batch or more:
    # the pace learns it at the claim, before any deadline passes.
    spec = spec_with(max_queue_ms=0)
    drain(queue, spec, spec.bins[0], waited_ms=waited_ms, deadline_ms=10_000,
          priority=priority, runs_before=runs_before)
    stats = queue.client.hgetall(queue.keys.model_stats(spec.name))
    assert float(stats.get("late_c", 0)) == pytest.approx(late, abs=0.01)


def test_the_admitted_end_share_is_admit_luas() -> None:
    lua = (Path(replies.__file__).parent / "lua" / "admit.lua").read_text()
    found = re.search(r"local DEADLINE_SHARE = ([0-9.]+)", lua)
    assert found is not None and float(found.group(1)) == replies.ADMITTED_END_SHARE


def test_a_job_with_a_deadline_must_be_predicted_to_end_by_it_its_own_batch_included(
        queue: Queue) -> None:
    spec = spec_with(max_queue_ms=0, max_batch=4)
    small = spec.bins[0]
    drain(queue, spec, small)  # ~10 jobs/s
    # 1 s of deadline holds ~10 jobs' work: the jobs ahead and a batch of its own (4).
    admitted, exc = fill_until_refused(queue, spec, small, deadline_ms=1000)
    assert isinstance(exc, WaitTooLong)
    assert admitted <= DRAINED - 4 + 2
