"""The simulator's bins (carpool/sim/bins.py) against the real Lua scripts on a real
Redis: the same admit, peek and claim operations, in the same order, must give the
same answers — accepted or refused, where each job sorts, what a peek reports, which
jobs a claim takes and which it ends expired, when a worker is woken. The simulator
is a second implementation of the queue; this test keeps the two from drifting.

The simulator is fed Redis's own clock: each job's admission time is read back from
the score admit.lua gave it, and each peek and claim runs at the time Redis answered.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from carpool.admission.urgency import effective_deadline_ms, sort_offset_ms
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.errors import BinFull
from carpool.core.jobs import BinState, new_job_id
from carpool.scheduling.batching import Cost
from carpool.sim.bins import SimBins, SimJob
from tests.support.procs import wait_until

TTL_S = 60
LEASE_MS = 60_000
#: Small bounds, so refusals, full bins and the claim's scan budget all happen.
MAX_DEPTH, MAX_BATCH = 7, 3
#: Deadlines (ms, 0: the model's default) and priorities the operations draw from:
#: short deadlines expire while queued, so claims meet expired jobs.
DEADLINES_MS = (0, 40, 80, 5_000, 20_000)
PRIORITIES = (0, 1, 3)
#: The longest a step waits for a queued job's deadline to pass.
SHORT_WAIT_MS = 200


def small_synthetic() -> ModelSpec:
    spec = load_catalogue(None).get("synthetic")
    bins = tuple(replace(b, max_depth=MAX_DEPTH, max_batch=MAX_BATCH) for b in spec.bins[:2])
    return replace(spec, bins=bins, max_queue_ms=0)


class Both:
    """One model's bins twice: in Redis (through Queue) and in the simulator."""

    def __init__(self, queue: Queue, spec: ModelSpec) -> None:
        self.queue, self.spec = queue, spec
        self.sim = SimBins(spec)
        self.ids: dict[int, str] = {}  # simulator seq -> Redis job id
        self.seq = 0
        self.passed = 0  # jobs a claim expired because their deadline had passed

    def redis_now_ms(self) -> int:
        seconds, micros = self.queue.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def admit(self, bin_name: str, deadline_ms: int, priority: int) -> None:
        spec, bin_spec = self.spec, self.spec.bin_named(bin_name)
        self.seq += 1
        job_id = new_job_id(spec.name)
        wake = self.queue.keys.wake(spec.name)
        self.queue.client.delete(wake)
        try:
            single_admitted(Admissions(self.queue.client, self.queue.keys).admit(AdmitRequest(
                spec, (AdmitJob(bin_spec, job_id, json.dumps({"value": 0, "size": 1})),),
                queued_ttl_s=TTL_S, deadline_ms=deadline_ms, priority=priority)))
            accepted = True
        except BinFull:
            accepted = False
        woken = self.queue.client.llen(wake) == 1
        # Redis's admission time, to the µs: the score less the job's sort offset.
        offset_ms = sort_offset_ms(spec, effective_deadline_ms(spec, deadline_ms), priority)
        score = self.queue.client.zscore(self.queue.keys.bin(spec.name, bin_name), job_id)
        admit_us = int(score) - offset_ms * 1000 if score is not None else 0
        if not accepted:  # refused by depth: the simulator needs no clock for that
            admit_us = self.redis_now_ms() * 1000
        job = SimJob(self.seq, bin_name, admit_us, 0, priority)
        wakes_before = self.sim.wakes
        assert self.sim.admit(admit_us, job, deadline_ms) is accepted, (
            f"job {self.seq} in {bin_name}: Redis {'accepted' if accepted else 'refused'} it")
        assert (self.sim.wakes > wakes_before) is woken, f"job {self.seq}: wake-up differs"
        if accepted:
            self.ids[self.seq] = job_id

    def peek(self) -> None:
        bins = [(self.spec.name, b.name) for b in self.spec.bins]
        scan = [b.max_batch for b in self.spec.bins]
        now_ms, states = self.queue.peek(bins, scan)
        assert self.sim.peek(now_ms * 1000, bins, scan) == states

    def claim(self, bin_name: str, max_n: int, cost: Cost | None = None) -> tuple[int, int]:
        claim = self.queue.claim(self.spec, bin_name, max_n, lease_ms=LEASE_MS,
                                 token=new_job_id(self.spec.name),
                                 worker="differential", cost=cost)
        live, expired = self.sim.claim(claim.now_ms * 1000, bin_name, max_n, cost)
        self.passed += sum(claim.now_ms >= j.deadline_ms for j in expired)
        assert [self.ids[j.seq] for j in live] == [j.id for j in claim.jobs]
        assert len(expired) == claim.expired
        return len(live), len(expired)

    def wait_for_a_deadline_to_pass(self) -> None:
        """Until Redis's clock passes the earliest deadline of a queued job, if one is
        due within SHORT_WAIT_MS (the short deadlines; the long ones are not waited for)."""
        states = self.sim.peek(0, [(self.spec.name, b.name) for b in self.spec.bins],
                               [MAX_DEPTH] * len(self.spec.bins))
        soon = self.redis_now_ms() + SHORT_WAIT_MS
        deadlines = [d for s in states if (d := s.earliest_deadline_ms) and d <= soon]
        if deadlines:
            wait_until(lambda: self.redis_now_ms() > min(deadlines), 10,
                       "Redis's clock to pass a queued job's deadline")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_simulators_bins_agree_with_the_lua_scripts(queue: Queue, seed: int) -> None:
    rng = random.Random(seed)
    costs = random.Random(seed + 100)  # its own, so the operations stay seed's
    both = Both(queue, small_synthetic())
    names = [b.name for b in both.spec.bins]
    claimed = expired = refused = 0
    for _ in range(120):
        op = rng.random()
        if op < 0.6:
            depth_before = sum(both.sim.depth(n) for n in names)
            both.admit(rng.choice(names), rng.choice(DEADLINES_MS), rng.choice(PRIORITIES))
            refused += sum(both.sim.depth(n) for n in names) == depth_before
        elif op < 0.75:
            both.peek()
        elif op < 0.95:
            live, dead = both.claim(rng.choice(names), rng.randint(1, MAX_BATCH),
                                    costs.choice((None, None, Cost(20.0, 15.0),
                                                  Cost(3_000.0, 1_000.0))))
            claimed, expired = claimed + live, expired + dead
        else:
            both.wait_for_a_deadline_to_pass()
    both.peek()
    # The operations reached every rule they compare: refusals, claims, expiries.
    assert claimed and refused, (claimed, refused)
    assert expired > both.passed or seed != 1, "seed 1's expires jobs too near a deadline"
    assert both.passed or seed != 1, "seed 1's schedule expires jobs while queued"


def test_a_claim_stops_at_its_scan_budget_among_expired_jobs_in_both(queue: Queue) -> None:
    both = Both(queue, small_synthetic())
    bin_name = both.spec.bins[0].name
    for _ in range(MAX_DEPTH - 1):
        both.admit(bin_name, 40, 3)  # expire soon, and sort first
    both.admit(bin_name, 20_000, 0)
    last_short_ms = max(e[2].deadline_ms for e in both.sim._bins[bin_name]
                        if e[2].priority == 3)
    wait_until(lambda: both.redis_now_ms() > last_short_ms, 10, "the short deadlines to pass")
    # One job asked: the scan budget (CLAIM_SCAN_FACTOR per job) ends four expired jobs
    # and finds no live one; the next claim ends the other two and takes the live job.
    assert both.claim(bin_name, 1) == (0, 4)
    assert both.claim(bin_name, 1) == (1, 2)
    both.peek()


def test_a_claim_expires_a_job_its_batch_cannot_finish_by_its_deadline_in_both(
        queue: Queue) -> None:
    both = Both(queue, small_synthetic())
    bin_name = both.spec.bins[0].name
    both.admit(bin_name, 5_000, 0)
    both.admit(bin_name, 20_000, 0)
    assert both.claim(bin_name, 2, cost=Cost(8_000.0, 1_000.0)) == (1, 1)


def test_a_disagreement_is_caught(queue: Queue) -> None:
    """The comparison has teeth: a simulator that sorted by admission alone (FIFO,
    ignoring priority) disagrees with the Lua on the first claim."""
    both = Both(queue, small_synthetic())
    bin_name = both.spec.bins[0].name
    both.admit(bin_name, 20_000, 0)
    both.admit(bin_name, 20_000, 3)  # sorts ahead of the first
    both.sim._bins[bin_name].sort(key=lambda e: e[2].seq)  # the FIFO mistake
    with pytest.raises(AssertionError):
        both.claim(bin_name, 1)


def test_peek_states_compare_field_by_field() -> None:
    # BinState is a frozen dataclass: == compares every field the peek reports.
    assert BinState("m", "b", 1, 2, 3, 4) != BinState("m", "b", 1, 2, 3, 5)
