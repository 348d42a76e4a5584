"""Autoscaling policies compared on one trace: carpool's need rule
(carpool/scheduling/need.py) against the proxies other systems scale on.

A simulation of one model in steps of ``dt_s``: arrivals at the trace's rate (as a
fluid: fractions of jobs), carpool's admission (refuse what would end past 0.7 × the
deadline: the jobs ahead at the live workers' pace, then its own full batch; with no
live worker, depth alone), one queue served in order by the live workers, each
claiming up to ``max_batch`` once a batch is full or its oldest job waited
``max_wait_ms`` (t(n) = a + b·n), jobs past their deadline expired. Every ``poll_s`` a
policy says how many workers it wants; one envelope, the same for every policy (KEDA's
and the HPA's as ops/k8s/keda-scaledobject.yaml sets them), acts on it: up at once
(each new worker serves after ``cold_start_s``), down by one worker per
``down_step_s`` once the wish was lower for ``down_window_s``. So the policies differ
only in what they ask for. Counted: deadline misses (served late or expired),
refusals and GPU-seconds (workers started, cold starts included).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from carpool.scheduling.batching import Cost
from carpool.scheduling.need import BinLoad, ModelLoad, workers_needed

#: The arrival rate a policy sees is averaged over about this long (the gauge's).
RATE_TAU_S = 30.0
#: Admission's share of the deadline for the predicted end (lib/pace.lua, admit.lua).
ADMIT_SHARE = 0.7


@dataclass(frozen=True)
class ScalingConfig:
    cost: Cost = Cost(300.0, 5.0)
    max_batch: int = 64
    deadline_ms: float = 10_000.0
    cold_start_s: float = 30.0
    dt_s: float = 0.25
    poll_s: float = 15.0
    down_window_s: float = 300.0
    down_step_s: float = 60.0
    max_workers: int = 8
    start_workers: int = 1
    max_depth: int = 20_000
    #: A bin's max_wait_ms: a batch leaves when full or its oldest job waited this long.
    max_wait_ms: float = 250.0

    def per_worker_per_s(self) -> float:
        """One worker's jobs per second at full batches."""
        return 1000.0 * self.max_batch / self.cost.ms(self.max_batch)


@dataclass(frozen=True)
class Observation:
    """What a policy may read at a poll."""

    now_s: float
    depth: float
    oldest_admit_s: float | None
    live: int
    starting: int
    busy: int
    #: Jobs in the batches running now.
    in_service: float
    #: Jobs admitted per second; and offered (admitted or refused).
    arrivals_per_s: float
    offered_per_s: float
    #: How long jobs have waited with no worker live or starting (SageMaker's alarm).
    stranded_s: float


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def desired(self, obs: Observation) -> int: ...


@dataclass(frozen=True)
class NeedRule:
    """carpool_workers_needed, from what the gauge reads: the admitted rate; with
    ``sees_refused``, the offered rate (refusals for capacity counted too)."""

    config: ScalingConfig
    sees_refused: bool = False
    name: str = "carpool need rule"

    def desired(self, obs: Observation) -> int:
        c = self.config
        slack = (None if obs.oldest_admit_s is None or obs.depth <= 0
                 else (obs.oldest_admit_s - obs.now_s) * 1000.0 + c.deadline_ms)
        refused_per_s = obs.offered_per_s - obs.arrivals_per_s if self.sees_refused else 0.0
        load = ModelLoad([BinLoad(math.ceil(obs.depth), c.max_batch, c.cost,
                                  obs.arrivals_per_s / 1000.0, refused_per_s / 1000.0)],
                         slack, c.deadline_ms, c.cold_start_s * 1000.0,
                         up=obs.live, busy=obs.busy, loading=obs.starting)
        return workers_needed(load).workers


@dataclass(frozen=True)
class QueueLength:
    """KEDA's list scaler: one worker per ``per_worker`` queued jobs (AverageValue)."""

    per_worker: int = 256
    name: str = "queue length (256/worker)"

    def desired(self, obs: Observation) -> int:
        return math.ceil(obs.depth / self.per_worker)


@dataclass(frozen=True)
class OngoingRequests:
    """Ray Serve: ongoing requests (at most ``max_ongoing`` per running replica; the
    rest wait in the handle's queue, which it does not count) per
    ``target_ongoing_requests``; from zero, one replica for a queued request."""

    target: float = 32.0
    max_ongoing: int = 64
    name: str = "Ray Serve target_ongoing_requests=32"

    def desired(self, obs: Observation) -> int:
        if obs.live == 0:
            return max(obs.starting, 1) if obs.depth > 0 else obs.starting
        ongoing = min(obs.depth + obs.in_service, obs.live * self.max_ongoing)
        return math.ceil(ongoing / self.target)


@dataclass(frozen=True)
class BacklogPerInstance:
    """SageMaker async: target tracking on backlog per instance (undefined at zero
    instances), plus the documented step policy on HasBacklogWithoutCapacity that
    adds one instance after its one-minute alarm."""

    target: float = 64.0
    alarm_s: float = 60.0
    name: str = "SageMaker backlog/instance=64"

    def desired(self, obs: Observation) -> int:
        instances = obs.live + obs.starting
        if instances == 0:
            return 1 if obs.stranded_s >= self.alarm_s else 0
        return math.ceil(obs.depth / self.target)


def standard_policies(config: ScalingConfig) -> list[Policy]:
    return [NeedRule(config),
            NeedRule(config, sees_refused=True, name="need rule, refusals counted"),
            QueueLength(), OngoingRequests(), BacklogPerInstance()]


@dataclass
class Outcome:
    policy: str
    offered: float = 0.0
    refused: float = 0.0
    served: float = 0.0
    late: float = 0.0
    expired: float = 0.0
    gpu_s: float = 0.0
    peak_workers: int = 0
    #: (time s, workers started, of them live, queued jobs), one per poll.
    series: list[tuple[float, int, int, float]] = field(default_factory=list)
    #: (time s, the policy's wish), one per poll.
    wishes: list[tuple[float, int]] = field(default_factory=list)

    @property
    def misses(self) -> float:
        return self.late + self.expired

    def to_json(self) -> dict[str, object]:
        return {"policy": self.policy, "offered": round(self.offered),
                "refused": round(self.refused), "served": round(self.served),
                "misses": round(self.misses), "late": round(self.late),
                "expired": round(self.expired), "gpu_s": round(self.gpu_s),
                "peak_workers": self.peak_workers}


def simulate(policy: Policy, rate_per_s: Callable[[float], float], duration_s: float,
             config: ScalingConfig) -> Outcome:
    c = config
    out = Outcome(policy.name)
    queue: deque[list[float]] = deque()  # cohorts [admit_s, jobs], oldest first
    ready_at = [0.0] * c.start_workers  # per worker started: when it serves
    free_at = [0.0] * c.start_workers  # ... and when its batch in hand ends
    batch_n = [0.0] * c.start_workers  # ... and its size
    wished: deque[tuple[float, int]] = deque()
    last_down_s, rate_count, offered_count, stranded_since = -math.inf, 0.0, 0.0, None
    decay = math.exp(-c.dt_s / RATE_TAU_S)
    steps = int(duration_s / c.dt_s)
    for i in range(steps):
        now = i * c.dt_s
        live = sum(r <= now for r in ready_at)
        depth = sum(cohort[1] for cohort in queue)
        # Admission, as admit.lua: the live workers' pace, else depth alone.
        offered = rate_per_s(now) * c.dt_s
        room = c.max_depth - depth
        if live:  # the jobs ahead at the live workers' pace, then a batch of its own
            pace_per_ms = live * c.max_batch / c.cost.ms(c.max_batch)
            wait_ms = ADMIT_SHARE * c.deadline_ms - c.cost.ms(c.max_batch)
            room = min(room, wait_ms * pace_per_ms - depth)
        admitted = min(offered, max(0.0, room))
        out.offered += offered
        out.refused += offered - admitted
        if admitted > 0:
            queue.append([now, admitted])
            depth += admitted
        rate_count = rate_count * decay + admitted
        offered_count = offered_count * decay + offered
        # Claims expire jobs past their deadline.
        while queue and (now - queue[0][0]) * 1000.0 > c.deadline_ms:
            out.expired += queue.popleft()[1]
            depth = sum(cohort[1] for cohort in queue)
        # Service, as the batching loop: a free live worker claims up to max_batch
        # once a batch is full or the oldest job waited max_wait_ms (its leave-by).
        for w, free in enumerate(free_at):
            if ready_at[w] > now:
                continue
            t0 = max(free, now)
            while t0 < now + c.dt_s and depth > 1e-9:
                if depth < c.max_batch and (t0 - queue[0][0]) * 1000.0 < c.max_wait_ms:
                    break
                n = min(float(c.max_batch), depth)
                end_s = t0 + c.cost.ms(max(1, round(n))) / 1000.0
                _take(queue, n, end_s, c.deadline_ms, out)
                depth -= n
                t0 = free_at[w] = end_s
                batch_n[w] = n
        running = [w for w, f in enumerate(free_at) if ready_at[w] <= now < f]
        busy, in_service = len(running), sum(batch_n[w] for w in running)
        stranded_since = (None if depth <= 0 or ready_at else
                          (now if stranded_since is None else stranded_since))
        out.gpu_s += len(ready_at) * c.dt_s
        if i % round(c.poll_s / c.dt_s) == 0:
            window = (1 - math.exp(-max(now, c.dt_s) / RATE_TAU_S)) * RATE_TAU_S
            obs = Observation(now, depth, queue[0][0] if queue else None, live,
                              len(ready_at) - live, busy, in_service, rate_count / window,
                              offered_count / window,
                              0.0 if stranded_since is None else now - stranded_since)
            wish = max(0, min(c.max_workers, policy.desired(obs)))
            out.wishes.append((now, wish))
            last_down_s = _envelope(ready_at, free_at, batch_n, wished, wish, now,
                                    last_down_s, c)
            out.series.append((now, len(ready_at), live, depth))
            out.peak_workers = max(out.peak_workers, len(ready_at))
    out.expired += sum(cohort[1] for cohort in queue)  # never served within the run
    return out


def _envelope(ready_at: list[float], free_at: list[float], batch_n: list[float],
              wished: deque[tuple[float, int]], wish: int, now: float, last_down_s: float,
              c: ScalingConfig) -> float:
    """The HPA's behaviour: up at once; down to the largest wish of the window, one
    worker per ``down_step_s``, the newest (a starting one first) removed; a busy one
    finishes its batch (its GPU-seconds are counted to the end of the step)."""
    wished.append((now, wish))
    while wished and wished[0][0] < now - c.down_window_s:
        wished.popleft()
    if wish > len(ready_at):
        added = wish - len(ready_at)
        ready_at.extend([now + c.cold_start_s] * added)
        free_at.extend([now + c.cold_start_s] * added)
        batch_n.extend([0.0] * added)
        return last_down_s
    allowed = max(w for _, w in wished)
    if allowed < len(ready_at) and now - last_down_s >= c.down_step_s:
        newest = ready_at.index(max(ready_at))
        del ready_at[newest], free_at[newest], batch_n[newest]
        return now
    return last_down_s


def _take(queue: deque[list[float]], n: float, end_s: float, deadline_ms: float,
          out: Outcome) -> None:
    """Claim ``n`` jobs from the head; those ending past their deadline are late."""
    while n > 1e-9 and queue:
        take = min(n, queue[0][1])
        if (end_s - queue[0][0]) * 1000.0 > deadline_ms:
            out.late += take
        out.served += take
        queue[0][1] -= take
        n -= take
        if queue[0][1] <= 1e-9:
            queue.popleft()


def burst_trace(base_per_s: float, factor: float = 10.0, burst_at_s: float = 300.0,
                burst_s: float = 60.0, decay_s: float = 180.0,
                level_per_s: float | None = None) -> Callable[[float], float]:
    """A quiet base, ``factor`` × it (or ``level_per_s``) for ``burst_s``, then an
    exponential decay back."""
    peak = base_per_s * factor if level_per_s is None else level_per_s

    def rate(t: float) -> float:
        if t < burst_at_s:
            return base_per_s
        if t < burst_at_s + burst_s:
            return peak
        return base_per_s + (peak - base_per_s) * math.exp(-(t - burst_at_s - burst_s)
                                                             / decay_s)
    return rate


def daily_trace(trough_per_s: float, peak_per_s: float,
                period_s: float = 86_400.0) -> Callable[[float], float]:
    """A day: the trough at 0 h, the peak at 12 h, a cosine between."""
    def rate(t: float) -> float:
        return trough_per_s + (peak_per_s - trough_per_s) * (1 - math.cos(
            2 * math.pi * t / period_s)) / 2
    return rate


def compare(policies: Sequence[Policy], rate_per_s: Callable[[float], float],
            duration_s: float, config: ScalingConfig) -> list[Outcome]:
    return [simulate(p, rate_per_s, duration_s, config) for p in policies]
