"""Keeping leases: renew the ones in hand, reap the expired ones, hand them back at stop.

``LeaseKeeper`` is a collaborator of ``BatchLoop``, which calls it by name (not an observer:
observers are monitoring, and what they raise is swallowed): ``hold`` when a batch
starts, ``finished`` when its results are written, ``hand_back`` when it ends
without them, ``reply_lost`` when a claim's reply never came. Its own thread wakes
every third of a lease and (1) renews every claim in hand, so a long batch keeps its
jobs, (2) hands back the jobs of claims whose reply was lost, once found, and (3)
runs the reaper once, so jobs of dead workers go back to their bins. Every worker
runs one; reap.lua is atomic, so any number may reap at once.

A job therefore waits at most ``lease_ms + lease_tick_ms`` after its worker
died before it is back at the front of its bin (if any worker is alive).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from carpool.backend.leases import REAP_BATCH, Leases
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import Claim
from carpool.core.settings import Settings

log = logging.getLogger(__name__)

#: Reap calls per tick at most, each of REAP_BATCH leases: a backlog after a mass
#: failure drains over a few ticks instead of holding Redis for long.
MAX_REAPS_PER_TICK = 10


@dataclass(frozen=True)
class Held:
    """One claim in hand: its jobs and when (monotonic seconds) its batch started."""

    claim: Claim
    since_s: float


class LeaseHolder(Protocol):
    """What the batch loop tells whoever keeps its leases, by name."""

    def hold(self, claim: Claim) -> None:
        """The claim's batch starts: keep its lease until ``finished`` or ``hand_back``."""

    def computed(self, claim: Claim) -> None:
        """The claim's outcomes are in hand: the model is done with it, only the write
        is left."""

    def finished(self, claim: Claim) -> None:
        """The claim's results are written (complete.lua ended its lease)."""

    def hand_back(self, claim: Claim, *, refund_attempt: bool) -> int:
        """Hand the claim's jobs back to the front of their bin now; how many went."""

    def reply_lost(self, token: str) -> None:
        """A call that may have leased jobs to ``token`` lost its reply: find them by
        token once Redis answers and hand them back, attempt refunded."""

    def abandon_all(self, worker: str) -> int:
        """This worker is about to die (its CUDA context is lost): end every lease it
        holds now and reap them, as for a dead worker, so each job is back in its bin
        at once with the attempt counted, and fails after ``max_attempts``. How many
        claims ended."""


class NoLeaseKeeper:
    """A ``LeaseHolder`` that keeps nothing: leases lapse (a loop in a test)."""

    def hold(self, claim: Claim) -> None:
        return None

    def computed(self, claim: Claim) -> None:
        return None

    def finished(self, claim: Claim) -> None:
        return None

    def hand_back(self, claim: Claim, *, refund_attempt: bool) -> int:
        return 0

    def reply_lost(self, token: str) -> None:
        return None

    def abandon_all(self, worker: str) -> int:
        return 0


class LeaseKeeper:
    """Renews the claims in hand and reaps expired leases, from one thread."""

    def __init__(self, leases: Leases, settings: Settings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.leases = leases
        self.settings = settings
        self.clock = clock
        self.reclaimed_total = 0  # leases this worker's reaper took back
        self.dead_total = 0  # of which failed after max_attempts
        #: Told how many leases each reap took back (the worker's Prometheus counter).
        self.on_reclaimed: Callable[[int], None] | None = None
        #: Told, once, of a claim still computing past CARPOOL_MAX_BATCH_MS (its forward
        #: pass hangs), with how long it has run (s); None: only logged.
        self.on_hung: Callable[[Claim, float], None] | None = None
        self._held: dict[str, Held] = {}
        #: Tokens of claims held whose outcomes are in hand (``computed``).
        self._computed: set[str] = set()
        #: Claims whose reply was lost, by token, with when (clock seconds): looked for on
        #: every tick for one lease (a hung Redis may run a claim sent before it froze
        #: only after it answers other calls), handed back once found.
        self._unanswered: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the loop tells it ------------------------------------------------------

    def hold(self, claim: Claim) -> None:
        with self._lock:
            self._held[claim.token] = Held(claim, self.clock())

    def computed(self, claim: Claim) -> None:
        with self._lock:
            if claim.token in self._held:
                self._computed.add(claim.token)

    def finished(self, claim: Claim) -> None:
        with self._lock:
            self._held.pop(claim.token, None)
            self._computed.discard(claim.token)

    def hand_back(self, claim: Claim, *, refund_attempt: bool) -> int:
        """Release the claim's jobs to the front of their bin now rather than after the
        lease; ``refund_attempt`` when they never reached a model. A claim no longer
        held (over CARPOOL_MAX_BATCH_MS: ``renew_all`` let it go), or Redis away: its
        lease lapses instead, and the reaper takes the jobs back."""
        with self._lock:
            held = self._held.pop(claim.token, None)
            self._computed.discard(claim.token)
        return 0 if held is None else self._release(claim, refund_attempt=refund_attempt)

    def reply_lost(self, token: str) -> None:
        with self._lock:
            self._unanswered[token] = self.clock()

    # -- the thread -----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="carpool-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        tick_s = self.settings.lease_tick_ms / 1000.0
        while True:  # first tick at once: a starting worker recovers a dead one's jobs
            try:
                self.tick()
            except BackendUnavailable as exc:
                log.warning("lease keeper: Redis unavailable (%s); next try in %.1f s",
                            exc, tick_s)
            except Exception:  # noqa: BLE001 — the keeper must outlive any one bug
                log.exception("lease keeper tick failed; next try in %.1f s", tick_s)
            if self._stopping.wait(tick_s):
                return

    def tick(self) -> None:
        """Renew every claim in hand, hand back lost claims' jobs, reap expired leases."""
        self.renew_all()
        self.recover_unanswered()
        self.reap()

    def recover_unanswered(self) -> None:
        """Hand back, attempt refunded, the jobs of claims whose reply was lost: they
        never reached a model, and must not come back through the reaper as suspects."""
        with self._lock:
            pending = dict(self._unanswered)
        window_s = self.settings.lease_ms / 1000.0
        for token, since_s in pending.items():
            ids = self.leases.leased_to(token)
            if ids:
                back = self.leases.release(token, ids, refund_attempt=True)
                log.warning("claim %s ran but its reply was lost: %d jobs handed back",
                            token, back.count(True))
            if ids or self.clock() - since_s > window_s:
                with self._lock:
                    self._unanswered.pop(token, None)

    def renew_all(self) -> None:
        max_s = self.settings.max_batch_ms / 1000.0
        now_s = self.clock()
        for held in self._snapshot():
            claim = held.claim
            if now_s - held.since_s > max_s:
                log.error("batch %s has run %.0f s, over CARPOOL_MAX_BATCH_MS: its lease is "
                          "left to lapse and its jobs will be retried", claim.token,
                          now_s - held.since_s)
                with self._lock:
                    self._held.pop(claim.token, None)
                    hung = claim.token not in self._computed
                    self._computed.discard(claim.token)
                if hung and self.on_hung is not None:
                    self.on_hung(claim, now_s - held.since_s)
                continue
            kept = self.leases.renew(claim.token, [j.id for j in claim.jobs],
                                     self.settings.lease_ms)
            lost = kept.count(False)
            if lost == len(kept):
                with self._lock:
                    self._held.pop(claim.token, None)
            if lost:
                log.warning("%d of %d leases of %s were lost before renewal (reaped or "
                            "ended); their results will be refused", lost, len(kept),
                            claim.token)

    def reap(self) -> None:
        for _ in range(MAX_REAPS_PER_TICK):
            report = self.leases.reap(self.settings.max_attempts)
            self.reclaimed_total += report.reclaimed
            self.dead_total += report.failed
            if report.reclaimed and self.on_reclaimed is not None:
                self.on_reclaimed(report.reclaimed)
            if report.reclaimed:
                log.warning("reaped %d expired leases: %d jobs back in their bins, %d failed "
                            "after %d attempts", report.reclaimed, report.requeued,
                            report.failed, self.settings.max_attempts)
            if report.requeued + report.failed + report.dropped < REAP_BATCH:
                return

    # -- hand-back ------------------------------------------------------------------

    def abandon_all(self, worker: str) -> int:
        with self._lock:
            self._held, self._computed = {}, set()
        ended = self.leases.end_leases_of(worker)
        self.reap()
        return ended

    def hand_back_all(self, *, refund_attempt: bool) -> int:
        """Release every claim in hand to the front of its bin; how many jobs went back."""
        with self._lock:
            held, self._held, self._computed = list(self._held.values()), {}, set()
        return sum(self._release(h.claim, refund_attempt=refund_attempt) for h in held)

    def _release(self, claim: Claim, *, refund_attempt: bool) -> int:
        try:
            back = self.leases.release(claim.token, [j.id for j in claim.jobs],
                                       refund_attempt=refund_attempt)
        except BackendUnavailable as exc:
            log.warning("could not hand back %s (%s); its lease will lapse instead",
                        claim.token, exc)
            return 0
        return back.count(True)

    def _snapshot(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())
