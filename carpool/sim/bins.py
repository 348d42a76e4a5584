"""An in-memory model of the Redis side: what admit.lua, peek.lua and claim.lua do
to the bins, on the simulator's clock. The scheduling rules are not here — they
are carpool's own (carpool.admission.urgency for where a job sorts, carpool.scheduling.scheduler for
which bin goes): this module only stands in for Redis.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from carpool.admission.urgency import effective_deadline_ms, score_us, sort_offset_ms
from carpool.backend.queue import CLAIM_SCAN_FACTOR
from carpool.core.catalogue import ModelSpec
from carpool.core.jobs import BinState
from carpool.scheduling.batching import Cost


@dataclass
class SimJob:
    """One job's fate; times in µs on the simulator's clock."""

    seq: int
    bin: str
    admit_us: int
    deadline_ms: int  # absolute, Redis-style (ms); 0: none
    priority: int
    status: str = "queued"  # queued | running | done | expired | rejected
    claim_us: int = -1
    done_us: int = -1
    batch_size: int = 0

    @property
    def latency_ms(self) -> float:
        return (self.done_us - self.admit_us) / 1000.0


@dataclass
class SimBins:
    """The bins of one model: sorted by (score, admission order), bounded by max_depth."""

    spec: ModelSpec
    #: A wake token is pushed when a bin gets its first job, a new head, or a full batch.
    wakes: int = 0
    _bins: dict[str, list[tuple[int, int, SimJob]]] = field(default_factory=dict)
    _admitted: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for b in self.spec.bins:
            self._bins[b.name] = []
            self._admitted[b.name] = 0

    def admit(self, now_us: int, job: SimJob, deadline_ms: int) -> bool:
        """Queue ``job`` (relative ``deadline_ms``); False when its bin is full."""
        bin_spec = self.spec.bin_named(job.bin)
        queue = self._bins[job.bin]
        if len(queue) >= bin_spec.max_depth:
            job.status = "rejected"
            return False
        deadline_ms = effective_deadline_ms(self.spec, deadline_ms)
        job.deadline_ms = now_us // 1000 + deadline_ms if deadline_ms > 0 else 0
        score = score_us(now_us, sort_offset_ms(self.spec, deadline_ms, job.priority))
        entry = (score, job.seq, job)
        bisect.insort(queue, entry, key=lambda e: (e[0], e[1]))
        self._admitted[job.bin] += 1
        after = len(queue)
        if after == 1 or after == bin_spec.max_batch or queue[0] is entry:
            self.wakes += 1
        return True

    def depth(self, bin_name: str) -> int:
        return len(self._bins[bin_name])

    def peek(self, now_us: int, bins: list[tuple[str, str]], scan: list[int]) -> list[BinState]:
        """What peek.lua answers: over all jobs of a bin below ``scan`` (its max_batch),
        over the head alone of a full one."""
        out = []
        for (model, name), n in zip(bins, scan, strict=True):
            queue = self._bins[name]
            head = [e[2] for e in queue[:1 if len(queue) >= n else n]]
            oldest = min((j.admit_us // 1000 for j in head), default=None)
            deadlines = [j.deadline_ms for j in head if j.deadline_ms > 0]
            out.append(BinState(model, name, len(queue), oldest,
                                min(deadlines) if deadlines else None, self._admitted[name]))
        return out

    def claim(self, now_us: int, bin_name: str, max_n: int,
              cost: Cost | None = None) -> tuple[list[SimJob], list[SimJob]]:
        """Up to ``max_n`` live jobs, most urgent first, and the expired ones taken with
        them: past their deadline, or with a deadline before their batch would end by
        ``cost``, the batch being the bin's jobs less the dead ones, at most ``max_n``
        (claim.lua)."""
        queue = self._bins[bin_name]
        now_ms = now_us // 1000
        depth, dead = len(queue), 0
        live: list[SimJob] = []
        expired: list[SimJob] = []
        budget = max_n * CLAIM_SCAN_FACTOR
        while len(live) < max_n and budget > 0 and queue:
            take = min(max_n - len(live), budget, len(queue))
            popped, queue[:take] = queue[:take], []
            budget -= take
            for _, _, job in popped:
                takes_ms = cost.ms(max(1, min(max_n, depth - dead))) if cost else 0.0
                if job.deadline_ms and (now_ms >= job.deadline_ms
                                        or now_ms + takes_ms > job.deadline_ms):
                    job.status, job.done_us = "expired", now_us
                    expired.append(job)
                    dead += 1
                else:
                    job.status, job.claim_us = "running", now_us
                    live.append(job)
        return live, expired
