"""The batching loop: peek → decide → claim → run → complete, blocking on Redis
(never sleep-polling) until a job arrives or the earliest bin deadline comes."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace

from carpool.backend.queue import ClaimAhead, Queue
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import BinState, Claim, Outcome
from carpool.core.settings import Settings
from carpool.scheduling.batching import Cost, Go, Limits, Wait
from carpool.scheduling.scheduler import BinKey, Scheduler
from worker.executors.base import BatchExecutor
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.base import ModelHandler
from worker.loop.completion import CompletionWriter, GaveUp
from worker.loop.hooks import BatchHooks, BatchReport, call_hooks

log = logging.getLogger(__name__)

#: Longest single block on Redis, so a stop request is noticed within this bound.
MAX_BLOCK_S = 1.0
#: Back-off bounds while Redis is unreachable.
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 5.0


@dataclass(frozen=True)
class _Flight:
    """A claimed batch handed to the executor and not yet completed in Redis."""

    claim: Claim
    started: float  # perf_counter at claim
    outcomes: Future[list[Outcome]]


@dataclass
class BatchLoop:
    """Serves every bin of ``handlers``' models from one thread of a Celery worker."""

    settings: Settings
    queue: Queue
    handlers: dict[str, ModelHandler]
    worker_name: str
    #: Told of each claim's life (worker/loop/hooks.py): Flower events, metrics and lease
    #: keeping hook in here.
    hooks: list[BatchHooks] = field(default_factory=list)
    #: Each may narrow a fresh claim before it runs (handing jobs back): isolation of
    #: suspect inputs hooks in here.
    claim_filters: list[Callable[[Claim], Claim]] = field(default_factory=list)
    #: Runs claimed batches: one at a time by default; the torch executor keeps two in
    #: flight (while batch N computes, batch N+1 is claimed, preprocessed and copied in).
    executor: BatchExecutor = field(default_factory=PipelinedExecutor)
    #: Calibrated t(n) = a + b·n per (model, bin), seeding the online fit.
    cost_seeds: dict[tuple[str, str], Cost] = field(default_factory=dict)
    #: Limits, cost models and the decision; Celery remote control retunes it.
    scheduler: Scheduler = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)
    _seq: int = 0
    batches: int = 0
    jobs: int = 0
    _in_flight: deque[_Flight] = field(default_factory=deque)
    _last_finished: float = 0.0  # perf_counter when the last batch was completed
    #: Writes each batch's results, retrying while Redis is away (worker/loop/completion.py).
    writer: CompletionWriter = field(init=False)
    #: Redis time and the states of the bins the last completion peeked (its model's),
    #: for the very next decision only: a worker serving one model then makes no peek
    #: round trip of its own between batches.
    _peeked: tuple[int, list[BinState]] | None = None
    #: The batch the last completion or peek claimed ahead (``ClaimAhead``), for the
    #: very next decision only: run if that decision takes it, else handed back.
    _ahead: Claim | None = None

    def __post_init__(self) -> None:
        self.writer = CompletionWriter(self.queue, self._stop,
                                       max_batch_s=self.settings.max_batch_ms / 1000.0,
                                       worker=self.worker_name)
        self.scheduler = Scheduler([h.spec for h in self.handlers.values()],
                                   adaptive=self.settings.adaptive_batching,
                                   cost_seeds=self.cost_seeds)

    def _fit(self, report: BatchReport) -> None:
        """Each finished batch refines its bin's cost model and SLO cap."""
        runtime_ms = report.runtime_s * 1000.0
        self.scheduler.observe(report.model, report.bin, report.size,
                               report.service_s * 1000.0,
                               [q + runtime_ms for q in report.queue_ms])

    @property
    def limits(self) -> dict[tuple[str, str], Limits]:
        """Each bin's limits in force now: as retuned, max_batch after the SLO's cap."""
        return self.scheduler.all_limits()

    def live_limits(self) -> dict[tuple[str, str], Limits]:
        """Each bin's limits as the next claim will see them: the executor's memory cap
        applied too (``BatchExecutor.limit``, as a claim is sized). Metrics and Flower
        show these."""
        return {key: replace(lim, max_batch=self.executor.limit(*key, lim.max_batch))
                for key, lim in self.limits.items()}

    def stop(self) -> None:
        """Ask the loop to end after the batch in hand."""
        self._stop.set()

    def run(self) -> None:
        try:
            self._run()
        finally:
            # The loop's own CPU, for `ops/bench/costs.py` and anyone sizing workers.
            log.info("batch loop ended: %d batches, %d jobs, %.3f s CPU in the loop thread",
                     self.batches, self.jobs, time.thread_time())

    def _run(self) -> None:
        backoff_s = BACKOFF_MIN_S
        while not self._stop.is_set():
            try:
                self.step()
                backoff_s = BACKOFF_MIN_S
            except (BackendUnavailable, GaveUp) as exc:
                log.warning("Redis unavailable (%s); retrying in %.1f s", exc, backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(BACKOFF_MAX_S, backoff_s * 2)
            except Exception:  # noqa: BLE001 — the loop outlives any one bug; leases recover jobs
                log.exception("batch loop step failed; retrying in %.1f s", backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(BACKOFF_MAX_S, backoff_s * 2)
        self.drain()

    def drain(self) -> None:
        """Complete every batch in flight (a stop finishes the batches in hand); hand
        back a batch claimed ahead and not started, first: it is not renewed."""
        self._hand_back()
        while self._in_flight:
            try:
                self._finish(self._in_flight.popleft())
            except GaveUp:
                pass  # logged; its jobs were handed back or their lease lapses
            except Exception:  # noqa: BLE001 — its jobs were handed back (or lapse)
                log.exception("completing a batch in flight failed at stop")
        self._hand_back()

    def step(self) -> None:
        """One decision: run a batch, or block until something may be due."""
        try:
            now_ms, states = self._states(self.scheduler.bins)
            decision = self.scheduler.decide(now_ms, states)
            ahead, self._ahead = self._ahead, None
            if isinstance(decision, Go):
                self.run_one(decision, ahead)
            else:
                self._hand_back(ahead)
                self.block(decision, now_ms)
        except BaseException:
            self._peeked = None  # _run backs off before the next step: they would be stale
            self._hand_back()  # and a batch claimed ahead would wait on a lease
            raise

    def _ahead_request(self, bins: list[BinKey]) -> ClaimAhead | None:
        """What a call that peeks ``bins`` may claim ahead: only when they are every bin
        this worker serves, all of one model (a script touches one model's shard), so
        its decision rests on them alone; never at stop, nor while a batch claimed
        ahead is still held."""
        if (not self.settings.claim_ahead or self._stop.is_set() or self._ahead is not None
                or len({model for model, _ in bins}) != 1
                or sorted(bins) != sorted(self.scheduler.bins)):
            return None
        limits = self.scheduler.all_limits()
        # The memory guard's cap as it stands: its ``limit`` reads memory and moves the
        # cap, and run_one asks it once for the batch it runs (a smaller answer then
        # hands the rest back).
        caps = {key: self.executor.guard.cap(key) for key in bins}
        max_n = tuple(0 if limits[key].paused else
                      max(1, min(limits[key].max_batch, caps[key] or limits[key].max_batch))
                      for key in bins)
        return ClaimAhead(self._token(), self.settings.lease_ms, self.worker_name,
                          self.settings.queued_ttl_s, max_n)

    def _hand_back(self, claim: Claim | None = None) -> None:
        """Hand back a batch claimed ahead that will not run (by default the one held);
        the jobs it ended expired are counted all the same."""
        if claim is None:
            claim, self._ahead = self._ahead, None
        if claim is None:
            return
        if claim.expired:
            call_hooks(self.hooks, lambda h: h.on_expired(claim))
        if claim.jobs:
            call_hooks(self.hooks, lambda h: h.on_unneeded(claim))

    def _unanswered(self, model: str, bin_name: str, token: str) -> None:
        """A call that may have leased jobs to ``token`` lost its reply: the lease
        keepers find them by token once Redis answers and hand them back."""
        unanswered = Claim(model, bin_name, token, 0, ())
        call_hooks(self.hooks, lambda h: h.on_unanswered(unanswered))

    def _states(self, bins: list[BinKey]) -> tuple[int, list[BinState]]:
        """Redis time and the state of ``bins``: those the last completion peeked, if it
        was the last thing done (a wait since would make them stale), and a peek of the
        rest."""
        peeked, self._peeked = self._peeked, None
        known = {(st.model, st.bin): st for st in peeked[1]} if peeked else {}
        rest = [key for key in bins if key not in known]
        now_ms = peeked[0] if peeked else 0
        ahead = self._ahead_request(rest) if rest else None
        if ahead is not None:
            model = rest[0][0]
            try:
                peek_ms, states, self._ahead = self.queue.peek_and_claim(
                    self.handlers[model].spec, [b for _, b in rest],
                    self.scheduler.scan_sizes(rest), ahead)
            except BaseException:  # it may have run: its token may hold jobs
                self._unanswered(model, rest[0][1], ahead.token)
                raise
            now_ms = max(now_ms, peek_ms)
            known.update({(st.model, st.bin): st for st in states})
        elif rest:
            peek_ms, states = self.queue.peek(rest, self.scheduler.scan_sizes(rest))
            now_ms = max(now_ms, peek_ms)
            known.update({(st.model, st.bin): st for st in states})
        return now_ms, [known[key] for key in bins if key in known]

    def block(self, decision: Wait, now_ms: int) -> None:
        wait_s = MAX_BLOCK_S
        if decision.until_ms is not None:
            wait_s = min(MAX_BLOCK_S, max(0.001, (decision.until_ms - now_ms) / 1000.0))
        if self._in_flight:
            # A batch is computing: its end is the next thing to act on; arrivals wait.
            oldest = self._in_flight[0]
            if wait_for([oldest.outcomes], timeout=wait_s).done:
                self._finish(self._in_flight.popleft())
            return
        if decision.until_ms is None:
            # No job waits either: idle until one arrives. A bin filling its batch
            # window (until_ms set) is not idle: telling hooks then would make Flower
            # send a message per batch again at moderate load.
            call_hooks(self.hooks, lambda h: h.on_idle())
        models = sorted({m for m, _ in self.scheduler.bins})
        self.queue.wait_for_work(models, wait_s)

    def _token(self) -> str:
        self._seq += 1
        return f"{self.worker_name}:{uuid.uuid4().hex[:8]}:{self._seq}"

    def run_one(self, go: Go, ahead: Claim | None = None) -> None:
        """Claim one batch (or take ``ahead``, the batch claimed ahead, when it is this
        one) and hand it to the executor; complete the oldest in flight once
        ``executor.depth`` batches are."""
        spec: ModelSpec = self.handlers[go.model].spec
        try:
            max_n = self.executor.limit(spec.name, go.bin, go.max_n)
        except BaseException:
            self._hand_back(ahead)
            raise
        if ahead is not None and (ahead.model, ahead.bin) != (go.model, go.bin):
            self._hand_back(ahead)
            ahead = None
        if ahead is not None and len(ahead.jobs) > max_n:
            # The limit moved since it was claimed (the SLO cap after the last batch, a
            # retune, the memory guard): the most urgent max_n run, the rest go back.
            self._hand_back(replace(ahead, jobs=ahead.jobs[max_n:], expired=0))
            ahead = replace(ahead, jobs=ahead.jobs[:max_n])
        if ahead is not None:
            claim = ahead
        else:
            token = self._token()
            try:
                claim = self.queue.claim(spec, go.bin, max_n, lease_ms=self.settings.lease_ms,
                                         token=token, worker=self.worker_name,
                                         queued_ttl_s=self.settings.queued_ttl_s)
            except BackendUnavailable:
                # The claim may have run with its reply lost (a timeout, a dropped
                # connection): jobs leased to a token nobody holds. Lease keepers find
                # them by token once Redis answers and hand them back, attempt refunded.
                self._unanswered(spec.name, go.bin, token)
                raise
        if claim.expired:
            call_hooks(self.hooks, lambda h: h.on_expired(claim))
        for narrow in self.claim_filters:
            claim = narrow(claim)
        if not claim.jobs:
            return  # another worker took them first, or they all expired
        self.batches += 1
        self.jobs += len(claim.jobs)
        call_hooks(self.hooks, lambda h: h.on_claimed(claim))
        # A job on a retry may be the input that kills workers (worker/loop/isolation.py):
        # it runs with no other batch in flight, before or after it, so a crash it
        # causes costs an attempt to it alone, not to a batch overlapping it.
        retry = any(j.attempts > 1 for j in claim.jobs)
        try:
            while retry and self._in_flight:  # and nothing claimed ahead to wait behind it
                self._finish(self._in_flight.popleft(), claim_ahead=False)
            t0 = time.perf_counter()
            future = self.executor.submit(self.handlers[go.model], spec.bin_named(go.bin),
                                          claim.jobs)
        except BaseException:
            call_hooks(self.hooks, lambda h: h.on_failed(claim))  # never submitted
            raise
        self._in_flight.append(_Flight(claim, t0, future))
        # Completing older batches may fail; each failure is reported for its own
        # batch (in _finish), never for this one, which is still computing.
        while self._in_flight and (retry or len(self._in_flight) >= self.executor.depth):
            self._finish(self._in_flight.popleft(), claim_ahead=not retry)

    def _finish(self, flight: _Flight, *, claim_ahead: bool = True) -> None:
        """Write a batch's outcomes (waiting for them) and call the hooks; if that
        fails, call ``on_failed`` (lease keepers hand the jobs back), then raise.
        ``claim_ahead``: the completion may claim the next batch ahead (not while a
        suspect's batch is about to run alone: a batch claimed then would wait, its
        lease unrenewed, behind it)."""
        try:
            self._complete(flight, claim_ahead)
        except BaseException as exc:
            if isinstance(exc, GaveUp):
                log.warning("%s: its jobs go back to their bin (or their lease lapses)", exc)
            call_hooks(self.hooks, lambda h: h.on_failed(flight.claim))
            raise

    def _complete(self, flight: _Flight, claim_ahead: bool = True) -> None:
        claim = flight.claim
        spec = self.handlers[claim.model].spec
        outcomes = flight.outcomes.result()
        batch = {"size": len(claim.jobs), "bin": claim.bin, "worker": self.worker_name}
        peek = [key for key in self.scheduler.bins if key[0] == claim.model]
        try:
            done = self.writer.write(spec, claim, outcomes, batch, flight.started,
                                     peek=[b for _, b in peek],
                                     scan=self.scheduler.scan_sizes(peek),
                                     ahead=self._ahead_request(peek) if claim_ahead else None)
        finally:
            for token in self.writer.take_unanswered():
                self._unanswered(claim.model, claim.bin, token)
        if done.states is not None:
            self._peeked = (done.now_ms, done.states)
        if done.ahead is not None:
            self._ahead = done.ahead
        written = done.written
        now = time.perf_counter()
        service_start = max(flight.started, self._last_finished)
        self._last_finished = now
        report = BatchReport(spec.name, claim.bin, len(claim.jobs),
                             failed=sum(o.failed for o in outcomes),
                             refused=written.count(False),
                             runtime_s=now - flight.started,
                             inference_ms=max((o.inference_ms for o in outcomes), default=0.0),
                             queue_ms=[claim.now_ms - j.admit_ms for j in claim.jobs],
                             outcomes=tuple(outcomes), written=tuple(written),
                             service_s=now - service_start)
        if report.refused:
            log.warning("%d results of %s refused: lease lost", report.refused, claim.token)
        call_hooks(self.hooks, lambda h: h.on_finished(claim, report))
        self._fit(report)
