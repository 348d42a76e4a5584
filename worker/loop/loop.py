"""The batching loop: peek → decide → claim → run → complete, each step one call,
blocking on Redis (never sleep-polling) until a job arrives or the earliest bin
deadline comes.

One source of bin states per decision: a completion answers its model's bin states
in the same script call (complete.lua), so a step that ended by completing a batch
returns those states, and the next step's ``peek`` takes them as its argument and
asks Redis only for the bins they leave out. Nothing else carries states from one
step to the next: a step that waited, failed or was followed by a back-off passes
none, and the next decision peeks every bin.

Leases are not observed: the loop calls its lease keeper by name (``hold``,
``finished``, ``hand_back``, ``reply_lost``: worker/loop/leasekeeper.py). Observers are
monitoring only (worker/loop/observers.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace

from carpool.backend.leases import claim_token
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import BackendUnavailable, DeviceLost
from carpool.core.jobs import BinState, Claim, Outcome, with_result_json
from carpool.core.settings import Settings
from carpool.scheduling.batching import Cost, Go, Limits, Wait
from carpool.scheduling.scheduler import BinKey, Scheduler
from worker.executors.base import BatchExecutor
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.base import ModelHandler
from worker.loop.completion import CompletionWriter, GaveUp
from worker.loop.leasekeeper import LeaseHolder, NoLeaseKeeper
from worker.loop.observers import BatchObserver, BatchReport, tell_observers
from worker.loop.repertoire import Repertoire

log = logging.getLogger(__name__)

#: Longest single block on Redis, so a stop request is noticed within this bound.
MAX_BLOCK_S = 1.0
#: Back-off bounds while Redis is unreachable.
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 5.0

#: Redis time (ms) and bin states a completion answered: what the next decision starts
#: from (its ``peek`` asks Redis for the other bins only).
Peeked = tuple[int, list[BinState]]


@dataclass(frozen=True)
class _Flight:
    """A claimed batch handed to the executor and not yet completed in Redis."""

    claim: Claim
    started: float  # perf_counter at claim
    outcomes: Future[list[Outcome]]


#: The exit status of a worker whose CUDA context was lost (EX_SOFTWARE): its
#: supervisor (`carpool up`, compose, Kubernetes) starts a fresh process.
EXIT_DEVICE_LOST = 70


def exit_process(exc: DeviceLost) -> None:
    """End the whole process at once: Celery's ping, the healthcheck and the GPU lease
    would otherwise stay green while every batch fails. Its leases were ended and
    reaped first (``BatchLoop._abandon_in_flight``)."""
    log.critical("%s: the worker exits (status %d) to be restarted", exc, EXIT_DEVICE_LOST)
    logging.shutdown()
    os._exit(EXIT_DEVICE_LOST)


def exit_stopped() -> None:
    """End a stopping worker now, status 0: Python's exit would join a hung compute thread."""
    logging.shutdown()
    os._exit(0)


@dataclass
class BatchLoop:
    """Serves every bin of ``handlers``' models from one thread of a Celery worker."""

    settings: Settings
    queue: Queue
    handlers: dict[str, ModelHandler]
    worker_name: str
    #: Told of each claim's life (worker/loop/observers.py): Flower events and metrics.
    #: Monitoring only: what an observer raises is logged, and no job depends on it.
    observers: list[BatchObserver] = field(default_factory=list)
    #: Keeps the leases of the batches in hand, and hands back the ones that end
    #: without their results (worker/loop/leasekeeper.py): the loop calls it by name.
    keeper: LeaseHolder = field(default_factory=NoLeaseKeeper)
    #: Each may narrow a fresh claim before it runs (handing jobs back): isolation of
    #: suspect inputs plugs in here.
    claim_filters: list[Callable[[Claim], Claim]] = field(default_factory=list)
    #: Runs claimed batches: one at a time by default; the torch executor keeps two in
    #: flight (while batch N computes, batch N+1 is claimed, preprocessed and copied in).
    executor: BatchExecutor = field(default_factory=PipelinedExecutor)
    #: Calibrated t(n) = a + b·n per (model, bin), seeding the online fit.
    cost_seeds: dict[tuple[str, str], Cost] = field(default_factory=dict)
    #: Limits, cost models and the decision; Celery remote control retunes it.
    scheduler: Scheduler = field(init=False)
    #: Called once the CUDA context is lost and every lease in hand was ended and reaped;
    #: the default ends the process (tests record it instead).
    on_device_lost: Callable[[DeviceLost], None] = exit_process
    #: Loads and unloads models between batches as the repository API asks
    #: (worker/loop/repertoire.py); None: the models served never change.
    repertoire: Repertoire | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _seq: int = 0
    batches: int = 0
    jobs: int = 0
    _in_flight: deque[_Flight] = field(default_factory=deque)
    #: Per model, jobs expired by claims that leased none: no completion carried them to
    #: admission's late count (complete.lua's late_c), so the model's next one does.
    _expired_unreported: dict[str, int] = field(default_factory=dict)
    _last_finished: float = 0.0  # perf_counter when the last batch was completed
    #: Writes each batch's results, retrying while Redis is away (worker/loop/completion.py).
    writer: CompletionWriter = field(init=False)

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
        """Each bin's limits as the next claim sees them, memory cap too, read-only (a
        scrape must not move the memory guard: ``view_limit``), for metrics and Flower."""
        return {key: replace(lim, max_batch=self.executor.view_limit(*key, lim.max_batch))
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
        peeked: Peeked | None = None
        while not self._stop.is_set():
            try:
                if self.repertoire is not None and self.repertoire.poll(self):
                    peeked = None  # the bins served changed
                peeked = self.step(peeked)
                backoff_s = BACKOFF_MIN_S
            except DeviceLost as exc:
                self._abandon_in_flight()
                self.on_device_lost(exc)
                return
            except (BackendUnavailable, GaveUp) as exc:
                peeked = None  # a back-off follows: states answered before it are stale
                log.warning("Redis unavailable (%s); retrying in %.1f s", exc, backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(BACKOFF_MAX_S, backoff_s * 2)
            except (Exception, SystemExit):  # the loop outlives any one bug; leases recover jobs
                # (a SystemExit too: raised on this thread it would end it, and it alone)
                peeked = None
                log.exception("batch loop step failed; retrying in %.1f s", backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(BACKOFF_MAX_S, backoff_s * 2)
        self.drain()

    def _abandon_in_flight(self) -> None:
        """Every claim in hand goes back as a dead worker's does (its lease ended now,
        then reaped), the attempt counted: the batch that raised may hold the input that
        broke the device; suspect isolation runs it alone on a retry, and ``max_attempts``
        fails it. A plain hand-back would return it forever."""
        claims = [f.claim for f in self._in_flight]
        self._in_flight.clear()
        try:
            self.keeper.abandon_all(self.worker_name)
        except Exception:  # noqa: BLE001 — the leases lapse and the reaper takes them back
            log.exception("ending the leases after the device was lost failed")
        for claim in claims:
            self._tell_failed(claim)

    def _tell_failed(self, claim: Claim) -> None:
        tell_observers(self.observers, lambda h: h.on_failed(claim))

    def add_model(self, handler: ModelHandler, cost_seeds: Mapping[BinKey, Cost]) -> None:
        """Serve ``handler``'s model from the next decision on (loaded and warmed)."""
        self.handlers[handler.spec.name] = handler
        self.scheduler.add(handler.spec, cost_seeds)

    def remove_model(self, model: str) -> None:
        """Claim no more of ``model``: call with no batch of it in flight (``drain``)."""
        self.scheduler.remove(model)
        del self.handlers[model]
        self._expired_unreported.pop(model, None)  # a reload starts its late count anew

    def drain(self) -> None:
        """Complete every batch in flight (a stop finishes the batches in hand)."""
        while self._in_flight:
            try:
                self._finish(self._in_flight.popleft())
            except GaveUp:
                pass  # logged; its jobs were handed back or their lease lapses
            except Exception:  # noqa: BLE001 — its jobs were handed back (or lapse)
                log.exception("completing a batch in flight failed at stop")

    def step(self, peeked: Peeked | None = None) -> Peeked | None:
        """One decision: run a batch, or block until something may be due. ``peeked``:
        the states the previous step's completion answered, if it ended in one; returns
        this step's, for the next."""
        now_ms, states = self.peek(peeked)
        decision = self.scheduler.decide(now_ms, states)
        if isinstance(decision, Go):
            return self.run_one(decision)
        return self.block(decision, now_ms)

    def peek(self, peeked: Peeked | None = None) -> Peeked:
        """Redis time and the state of every bin served: those in ``peeked`` (a
        completion's, just before), and one peek call for the rest."""
        bins = self.scheduler.bins
        known = {(st.model, st.bin): st for st in peeked[1]} if peeked else {}
        rest = [key for key in bins if key not in known]
        now_ms = peeked[0] if peeked else 0
        if rest:
            peek_ms, states = self.queue.peek(rest, self.scheduler.scan_sizes(rest))
            now_ms = max(now_ms, peek_ms)
            known.update({(st.model, st.bin): st for st in states})
        return now_ms, [known[key] for key in bins if key in known]

    def block(self, decision: Wait, now_ms: int) -> Peeked | None:
        """Wait for the batch in flight to end (completing it: returns the states its
        completion answered), or for work, until ``decision`` may be due."""
        wait_s = MAX_BLOCK_S
        if decision.until_ms is not None:
            wait_s = min(MAX_BLOCK_S, max(0.001, (decision.until_ms - now_ms) / 1000.0))
        if self._in_flight:
            # A batch is computing: its end is the next thing to act on; arrivals wait.
            oldest = self._in_flight[0]
            if wait_for([oldest.outcomes], timeout=wait_s).done:
                return self._finish(self._in_flight.popleft())
            return None
        if decision.until_ms is None:
            # No job waits either: idle until one arrives. A bin filling its batch
            # window (until_ms set) is not idle: telling observers then would make Flower
            # send a message per batch again at moderate load.
            tell_observers(self.observers, lambda h: h.on_idle())
        models = sorted({m for m, _ in self.scheduler.bins})
        if models:
            self.queue.wait_for_work(models, wait_s)
        else:  # every model unloaded: nothing to wake it but the repository's next poll
            self._stop.wait(wait_s)
        return None

    def _token(self) -> str:
        self._seq += 1
        return claim_token(self.worker_name, self._seq)

    def claim(self, go: Go) -> Claim:
        """Lease the batch ``go`` decided, sized by the executor's limit. A claim whose
        reply was lost (a timeout, a dropped connection) may have leased jobs to a
        token nobody holds: the lease keeper finds them by token once Redis answers
        and hands them back, attempt refunded."""
        spec: ModelSpec = self.handlers[go.model].spec
        max_n = self.executor.limit(spec.name, go.bin, go.max_n)
        token = self._token()
        try:
            claim = self.queue.claim(spec, go.bin, max_n, lease_ms=self.settings.lease_ms,
                                     token=token, worker=self.worker_name,
                                     queued_ttl_s=self.settings.queued_ttl_s,
                                     cost=self.scheduler.cost_of((go.model, go.bin)))
        except BackendUnavailable:
            self.keeper.reply_lost(token)
            raise
        if claim.expired:
            tell_observers(self.observers, lambda h: h.on_expired(claim))
        for narrow in self.claim_filters:
            claim = narrow(claim)
        return claim

    def run_one(self, go: Go) -> Peeked | None:
        """Claim one batch and hand it to the executor; complete the oldest in flight
        once ``executor.depth`` batches are (returns the states the last completion
        answered, if any)."""
        claim = self.claim(go)
        if not claim.jobs:  # another worker took them first, or they all expired
            if claim.expired:
                self._expired_unreported[go.model] = (
                    self._expired_unreported.get(go.model, 0) + claim.expired)
            return None
        carried = self._expired_unreported.pop(go.model, 0)
        if carried:  # observers counted them at their claim; only the late count is owed
            claim = replace(claim, expired=claim.expired + carried)
        self.batches += 1
        self.jobs += len(claim.jobs)
        self.keeper.hold(claim)
        tell_observers(self.observers, lambda h: h.on_claimed(claim))
        # A job on a retry may be the input that kills workers (worker/loop/isolation.py):
        # it runs with no other batch in flight, before or after it, so a crash it
        # causes costs an attempt to it alone, not to a batch overlapping it.
        retry = any(j.attempts > 1 for j in claim.jobs)
        peeked: Peeked | None = None
        try:
            while retry and self._in_flight:
                peeked = self._finish(self._in_flight.popleft())
            t0 = time.perf_counter()
            future = self.executor.submit(self.handlers[go.model],
                                          self.handlers[go.model].spec.bin_named(go.bin),
                                          claim.jobs)
        except BaseException:
            self._failed(claim)  # never submitted
            raise
        def computed(_: Future[list[Outcome]]) -> None:  # as the pass ends, not as written:
            self.keeper.computed(claim)  # a Redis outage past MAX_BATCH_MS is no hang
        future.add_done_callback(computed)
        self._in_flight.append(_Flight(claim, t0, future))
        # Completing older batches may fail; each failure is reported for its own
        # batch (in _finish), never for this one, which is still computing.
        while self._in_flight and (retry or len(self._in_flight) >= self.executor.depth):
            peeked = self._finish(self._in_flight.popleft())
        return peeked

    def _failed(self, claim: Claim) -> None:
        """A batch ended without its results written: its jobs go back now, the attempt
        counted (they may have reached the model)."""
        try:
            self.keeper.hand_back(claim, refund_attempt=False)
        finally:
            tell_observers(self.observers, lambda h: h.on_failed(claim))

    def _finish(self, flight: _Flight) -> Peeked | None:
        """Write a batch's outcomes (waiting for them) and tell the observers; returns the
        states the completion answered. If that fails, hand the batch back, then
        raise."""
        try:
            return self._complete(flight)
        except DeviceLost:
            self._in_flight.appendleft(flight)  # abandoned with the rest (_abandon_in_flight)
            raise
        except BaseException as exc:
            if isinstance(exc, GaveUp):
                log.warning("%s: its jobs go back to their bin (or their lease lapses)", exc)
            self._failed(flight.claim)
            raise

    def _complete(self, flight: _Flight) -> Peeked | None:
        claim = flight.claim
        spec = self.handlers[claim.model].spec
        # Encoded here, on the loop's thread, while the compute thread runs the next
        # batch; a result JSON cannot carry fails its job alone (and counts as failed).
        outcomes = [with_result_json(o) for o in flight.outcomes.result()]
        # The claim's token names the batch: every job of a claim ran in this one batch
        # (a split of it included), a retry runs under another claim.
        batch = {"id": claim.token, "size": len(claim.jobs), "bin": claim.bin,
                 "worker": self.worker_name, "model_version": spec.version}
        peek = [key for key in self.scheduler.bins if key[0] == claim.model]
        # Its own service: from its start, or from the end of the batch it overlapped.
        service_start = max(flight.started, self._last_finished)
        done = self.writer.write(spec, claim, outcomes, batch, flight.started,
                                 peek=[b for _, b in peek],
                                 scan=self.scheduler.scan_sizes(peek), busy_from_s=service_start)
        self.keeper.finished(claim)
        written = done.written
        now = time.perf_counter()
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
        tell_observers(self.observers, lambda h: h.on_finished(claim, report))
        self._fit(report)
        return None if done.states is None else (done.now_ms, done.states)
