"""The discrete-event simulation: arrivals, the bins, and workers that each run
carpool's own ``Scheduler`` the way worker/loop/loop.py does — peek → decide → claim →
run → complete, or block until a wake token or the decision's time — on a fake
clock, in µs. Deterministic: the same config and schedule give the same run.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from carpool.backend.queue import WAKE_LIST_CAP
from carpool.bench.arrivals import Arrival
from carpool.core.catalogue import ModelSpec
from carpool.scheduling.batching import MAX_BYPASS, Cost, Go
from carpool.scheduling.scheduler import Scheduler
from carpool.sim.bins import SimBins, SimJob

#: The loop's longest block, as in worker/loop/loop.py (MAX_BLOCK_S).
MAX_BLOCK_US = 1_000_000
#: Simulated time allowed after the last arrival for the queue to drain.
DRAIN_GRACE_US = 600_000_000
_ARRIVE, _DONE, _STEP, _TIMER = 0, 1, 2, 3  # same-µs order: arrivals first


@dataclass(frozen=True)
class SimConfig:
    spec: ModelSpec
    #: What a batch of n truly takes (the model and the completion round trip).
    cost: Cost
    workers: int = 1
    #: Bins whose batches cost otherwise (a model's long inputs), by bin name.
    bin_costs: tuple[tuple[str, Cost], ...] = ()
    adaptive: bool = True
    #: Each batch's service time is multiplied by a lognormal factor of this sigma.
    jitter: float = 0.0
    #: One Redis round trip (peek, claim or a returning BLPOP); measured ~0.2 ms
    #: (docs/benchmarks.md).
    rtt_us: int = 250
    #: Worker time per batch outside its measured runtime (hooks such as Flower
    #: events, Python between steps): what a real run adds to the two round trips.
    overhead_us: int = 0
    cost_seed: Cost | None = None
    max_bypass: int = MAX_BYPASS
    seed: int = 1


@dataclass(frozen=True)
class SimBatch:
    start_us: int
    bin: str
    size: int
    worker: int
    service_us: int


@dataclass
class SimResult:
    jobs: list[SimJob]
    batches: list[SimBatch]
    schedulers: list[Scheduler]


@dataclass
class _Worker:
    idx: int
    scheduler: Scheduler
    #: When this worker's current block times out; None while it is not blocked.
    timer_us: int | None = None


@dataclass
class _Run:
    config: SimConfig
    schedule: list[Arrival]
    bins: SimBins
    workers: list[_Worker]
    rng: random.Random
    keys: list[tuple[str, str]]
    heap: list[tuple[int, int, int, int]] = field(default_factory=list)
    blocked: deque[_Worker] = field(default_factory=deque)
    tokens: int = 0
    pending: int = 0
    seq: int = 0
    jobs: list[SimJob] = field(default_factory=list)
    batches: list[SimBatch] = field(default_factory=list)
    running: dict[int, tuple[list[SimJob], SimBatch]] = field(default_factory=dict)

    def push(self, t_us: int, kind: int, arg: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t_us, kind, self.seq, arg))

    def arrive(self, t_us: int, i: int) -> None:
        a = self.schedule[i]
        self.pending -= 1
        job = SimJob(i, self.config.spec.bin_for(a.size).name, t_us, 0, a.priority)
        self.jobs.append(job)
        wakes = self.bins.wakes
        self.bins.admit(t_us, job, a.deadline_ms)
        if self.bins.wakes > wakes:
            if self.blocked:  # BLPOP hands the token to the worker that blocked first
                w = self.blocked.popleft()
                w.timer_us = None
                self.push(t_us + self.config.rtt_us, _STEP, w.idx)
            else:
                self.tokens = min(WAKE_LIST_CAP, self.tokens + 1)

    def step(self, t_us: int, w: _Worker) -> None:
        rtt = self.config.rtt_us
        now_ms = t_us // 1000
        states = self.bins.peek(t_us, self.keys, w.scheduler.scan_sizes(self.keys))
        decision = w.scheduler.decide(now_ms, states)
        t_us += rtt
        if isinstance(decision, Go):
            self.run_batch(t_us + rtt + self.config.overhead_us, w, decision)
        elif self.tokens:
            self.tokens -= 1
            self.push(t_us + rtt, _STEP, w.idx)
        else:
            self.block(t_us, now_ms, w, decision.until_ms)

    def block(self, t_us: int, now_ms: int, w: _Worker, until_ms: int | None) -> None:
        self.blocked.append(w)
        if until_ms is None:
            if self.pending == 0 and all(self.bins.depth(b) == 0 for _, b in self.keys):
                return  # nothing will ever arrive: this worker is done
            wake_us = t_us + MAX_BLOCK_US
        else:  # as worker/loop/loop.py: at least 1 ms, at most MAX_BLOCK_S
            wake_us = t_us + min(MAX_BLOCK_US, max(1000, (until_ms - now_ms) * 1000))
        w.timer_us = wake_us
        self.push(wake_us, _TIMER, w.idx)

    def run_batch(self, t_us: int, w: _Worker, go: Go) -> None:
        live, _expired = self.bins.claim(t_us, go.bin, go.max_n,
                                         w.scheduler.cost_of((go.model, go.bin)))
        if not live:
            self.push(t_us, _STEP, w.idx)
            return
        factor = math.exp(self.rng.gauss(0.0, self.config.jitter)) if self.config.jitter else 1.0
        cost = dict(self.config.bin_costs).get(go.bin, self.config.cost)
        service_us = max(1, round(cost.ms(len(live)) * 1000 * factor))
        batch = SimBatch(t_us, go.bin, len(live), w.idx, service_us)
        self.running[w.idx] = (live, batch)
        self.push(t_us + service_us, _DONE, w.idx)

    def finish(self, t_us: int, w: _Worker) -> None:
        live, batch = self.running.pop(w.idx)
        for job in live:
            job.status, job.done_us, job.batch_size = "done", t_us, batch.size
        self.batches.append(batch)
        w.scheduler.observe(self.config.spec.name, batch.bin, batch.size,
                            batch.service_us / 1000.0, [j.latency_ms for j in live])
        self.step(t_us, w)

    def timer(self, t_us: int, w: _Worker) -> None:
        if w.timer_us != t_us:
            return  # a token woke it earlier: this timer is stale
        self.blocked.remove(w)
        w.timer_us = None
        self.step(t_us, w)


def simulate(config: SimConfig, schedule: list[Arrival]) -> SimResult:
    """Run ``schedule`` through ``config.workers`` simulated workers until all is done."""
    spec = config.spec
    seeds = {(spec.name, b.name): config.cost_seed for b in spec.bins} if config.cost_seed else {}
    workers = [_Worker(i, Scheduler([spec], adaptive=config.adaptive, cost_seeds=seeds,
                                    max_bypass=config.max_bypass))
               for i in range(config.workers)]
    run = _Run(config, schedule, SimBins(spec), workers, random.Random(config.seed),
               [(spec.name, b.name) for b in spec.bins], pending=len(schedule))
    for i, a in enumerate(schedule):
        run.push(round(a.t_s * 1_000_000), _ARRIVE, i)
    for w in workers:
        run.push(0, _STEP, w.idx)
    end_us = (round(schedule[-1].t_s * 1_000_000) if schedule else 0) + DRAIN_GRACE_US
    while run.heap:
        t_us, kind, _, arg = heapq.heappop(run.heap)
        if t_us > end_us:
            break
        if kind == _ARRIVE:
            run.arrive(t_us, arg)
        elif kind == _DONE:
            run.finish(t_us, workers[arg])
        elif kind == _STEP:
            run.step(t_us, workers[arg])
        else:
            run.timer(t_us, workers[arg])
    return SimResult(run.jobs, run.batches, [w.scheduler for w in workers])
