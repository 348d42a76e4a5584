"""One way through for every synchronous request: ``POST /submit?wait=S`` (or ``Prefer:
wait``), ``POST /submit/batch?wait=S``, ``POST /v2/models/<m>/infer`` and
``POST /v1/embeddings``.

Each holds one of its client's long-poll slots (web/results/polls.py) while it waits,
watches its jobs before they are admitted (a completion that comes at once still wakes
it: web/results/waiters.py), admits them in one ``Admissions.admit`` call, counts
those queued in ``carpool_jobs_submitted_total`` (refusals: the error handlers, in
``carpool_jobs_rejected_total``), and waits until they end or the wait does.

**A caller who hangs up is not computed for.** While it waits, a request looks at its
socket every ``CLIENT_CHECK_S``; once the client has closed it, each of its jobs still
queued is cancelled (cancel.lua's queued-only mode: a claimed or running job is never
touched), its error ``client_gone: ...``, and counted in
``carpool_jobs_abandoned_total{model}``; the request ends 499. A job sent with an
idempotency key is kept: a retry with that key finds it.

**A caller's own timeout.** ``X-Carpool-Timeout: <seconds>`` says how long the caller
waits (``carpool.client`` sends it). It becomes its jobs' deadline (the lesser of it
and a ``deadline_ms``; at most the model's ``max_deadline_ms``), so admission refuses a
job predicted to end after it (429 ``wait_too_long``) and a claim expires one still
queued past it; the request's wait is cut to it too.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Protocol

from flask import Request

from carpool.backend.admissions import AdmitJob, AdmitOutcome, AdmitRequest, single_admitted
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import BackendUnavailable, CarpoolError, InvalidInput, NotCancellable
from carpool.core.jobs import Admitted, JobView
from web.common.auth import service_tier
from web.common.errors import AdmissionUnknown
from web.common.metrics import jobs_admitted, refusing_jobs
from web.common.refusals import CallerGone
from web.common.state import WebState
from web.results.polls import ClientGone, TooManyPolls, client_gone_check
from web.results.waiters import await_final_after, wait_for_final

log = logging.getLogger(__name__)

#: The request header in which a caller says how long it waits, in seconds.
TIMEOUT_HEADER = "X-Carpool-Timeout"
#: The longest timeout the header may state (a day); a job's deadline is at most its
#: model's ``max_deadline_ms`` anyway.
MAX_TIMEOUT_S = 86_400.0
#: The error of a job cancelled because its caller hung up.
GONE_REASON = "client_gone: the caller closed its connection while the job was queued"


class JobOptionsLike(Protocol):
    """What a request asks of its jobs: ``inputs.Options`` (/submit), ``JobOptions`` (/v2)."""

    @property
    def deadline_ms(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def hook(self) -> str: ...


def caller_timeout_ms(raw: str | None) -> int:
    """``X-Carpool-Timeout``'s seconds in ms; 0 without one. 400 for anything but a
    number of seconds above 0."""
    if raw is None:
        return 0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:  # also refuses nan
        raise InvalidInput(f"{TIMEOUT_HEADER} must be the seconds the caller waits, above 0 "
                           f"and at most {MAX_TIMEOUT_S:g}, got {raw[:40]!r}")
    return max(1, int(seconds * 1000))


def job_deadline_ms(spec: ModelSpec, asked_ms: int, timeout_ms: int) -> int:
    """The deadline of a job that asked for ``asked_ms`` (0: none) whose caller waits
    ``timeout_ms`` (0: unsaid): the sooner of the two, the caller's at most the model's
    ``max_deadline_ms``."""
    if not timeout_ms:
        return asked_ms
    waits_ms = min(timeout_ms, spec.max_deadline_ms)
    return min(asked_ms, waits_ms) if asked_ms else waits_ms


class SyncWait:
    """One synchronous request's jobs: a slot held, watched, admitted, waited for.

    Used as a context: the slot and the watches are released at its end. ``wait_s``
    is 0 when the request does not wait (then nothing is watched and ``finals`` answers
    at once), or when its client holds all its slots and the slot is not required.
    """

    def __init__(self, state: WebState, owner: str, wait_s: float, *,
                 req: Request, slot_required: bool = False) -> None:
        self.state = state
        self.owner = owner
        self.req = req
        self.timeout_ms = caller_timeout_ms(req.headers.get(TIMEOUT_HEADER))
        self.wait_s = min(wait_s, self.timeout_ms / 1000) if self.timeout_ms else wait_s
        self.deadline = time.monotonic() + self.wait_s
        self._slot_required = slot_required
        self._stack = ExitStack()
        self._woken: dict[str, threading.Event] = {}
        #: Jobs this request queued (no duplicate, no idempotency key): cancelled while
        #: still queued if its client hangs up.
        self._ours: list[Admitted] = []
        self._check = client_gone_check(req.environ)
        self._left = False

    def __enter__(self) -> SyncWait:
        if self.wait_s > 0:
            try:
                self._stack.enter_context(
                    self.state.polls.hold(self.owner or self.req.remote_addr or ""))
            except TooManyPolls:
                if self._slot_required:
                    raise
                self.wait_s = 0.0  # the answer is the 202: no wait, nothing watched
            else:
                self._stack.enter_context(self.state.metrics.long_polls.track_inprogress())
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                 ) -> None:
        self._stack.close()

    def request(self, spec: ModelSpec, jobs: Sequence[AdmitJob],
                options: JobOptionsLike | None = None, tier_asked: str = "") -> AdmitRequest:
        """``jobs`` as one admission, with the request's options, owner and timeout, in
        the key's service tier or the lower one asked for (a body's ``service_tier``, else
        the ``X-Service-Tier`` header; web/common/auth.py)."""
        settings = self.state.settings
        deadline_ms = job_deadline_ms(spec, options.deadline_ms if options else 0,
                                      self.timeout_ms)
        return AdmitRequest(spec, tuple(jobs), settings.queued_ttl_s, deadline_ms,
                            options.priority if options else 0, self.owner,
                            settings.api_key_weights.get(self.owner, 1.0),
                            hook=options.hook if options else "",
                            tier=service_tier(settings, self.owner, self.req, tier_asked))

    def admit(self, req: AdmitRequest, *, one: bool = False) -> list[AdmitOutcome]:
        """Each job's outcome, watched first when the request waits; nothing counted
        (``took`` counts a job queued). Raises ``AdmissionUnknown`` when Redis failed in
        the first admit.lua call: its jobs may be queued, so the answer names them (its
        ``id`` for a submit of ``one`` job, else its ``ids``)."""
        self.state.models.check(req.model.name)  # 503 at once: every live worker refused it
        if self.wait_s > 0:
            for job in req.jobs:
                self._woken[job.id] = self._stack.enter_context(
                    self.state.notifier.watch(job.id))
        try:
            outcomes = self.state.admissions.admit(req)
        except BackendUnavailable as exc:
            if one:
                raise AdmissionUnknown([req.jobs[0].id], exc) from exc
            refusing_jobs(len(req.jobs))  # counted by the error handler, all of them
            # The first bin's call failed: it may still run once Redis resumes; later
            # bins' calls were never sent.
            first = [job.id for job in req.jobs if job.bin.name == req.jobs[0].bin.name]
            raise AdmissionUnknown(first, exc, many=True) from exc
        self.state.routing.shadow(req, outcomes)
        return outcomes

    def took(self, admitted: Admitted, kept: bool = False) -> None:
        """Count a job queued; unless ``kept`` (an idempotency key), it is cancelled
        while still queued if the client hangs up."""
        self.state.metrics.count_submitted(admitted)
        if not admitted.duplicate and not kept:
            self._ours.append(admitted)

    def admit_one(self, req: AdmitRequest) -> Admitted:
        """The one job queued (or the first of its idempotency key); raises its refusal."""
        admitted = single_admitted(self.admit(req, one=True))
        self.took(admitted, kept=req.idempotency_digest is not None)
        jobs_admitted(self.req)
        return admitted

    def admit_all(self, req: AdmitRequest) -> list[Admitted]:
        """Every job queued, or none: a refused job cancels those queued with it (no
        webhook: no client learns of them) and its refusal is raised for them all."""
        outcomes = self.admit(req)
        admitted = [o for o in outcomes if isinstance(o, Admitted)]
        refused = next((o for o in outcomes if not isinstance(o, Admitted)), None)
        if refused is None:
            for job in admitted:
                self.took(job)
            jobs_admitted(self.req)
            return admitted
        for job in admitted:
            try:
                self.state.queue.cancel(job.id, req.model.result_ttl_s, notify=False)
            except (NotCancellable, BackendUnavailable):  # already running: it ends alone
                log.info("job %s of a refused request could not be cancelled", job.id)
        refusing_jobs(len(req.jobs))
        raise refused

    def finals(self, admitted: Sequence[Admitted]) -> list[JobView | None]:
        """Each job's final view if it ends within the wait, else None, in order.

        Raises ``CallerGone`` once the client has closed its connection, after
        cancelling this request's jobs still queued."""
        if self.wait_s <= 0:
            return [None] * len(admitted)
        gone = self._gone()
        views: list[JobView | None] = []
        for job in admitted:
            view = None
            if self._left:
                pass  # gone: no more waiting
            elif job.id in self._woken and not job.duplicate:
                view = await_final_after(self.state.reads, self._woken[job.id], job.id,
                                         self.deadline, gone)
            else:  # a duplicate: the first job's, not watched before admission
                view = wait_for_final(self.state.reads, self.state.notifier, job.id,
                                      max(0.0, self.deadline - time.monotonic()), gone)
            views.append(view if view is not None and view.status.is_final else None)
        if not self._left and None in views and gone is not None:
            gone()  # the wait ran out: a client gone by now is gone as well
        if self._left:
            self._abandon({v.id for v in views if v is not None})
            raise CallerGone("the client closed its connection while waiting; its jobs "
                             "still queued were cancelled")
        return views

    def _gone(self) -> ClientGone | None:
        """The client check, remembering once it said gone (every later wait ends)."""
        check = self._check
        if check is None:
            return None

        def gone() -> bool:
            if not self._left and check():
                self._left = True
            return self._left

        return gone

    def _abandon(self, ended: set[str]) -> None:
        """Cancel this request's jobs that are still queued, and count them."""
        catalogue = self.state.settings.catalogue
        for job in self._ours:
            if job.id in ended:
                continue
            try:
                outcome = self.state.queue.cancel_queued(
                    job.id, catalogue.result_ttl_s(job.model), GONE_REASON)
            except CarpoolError as exc:  # Redis away: the job runs, for nobody
                log.warning("job %s of a client that hung up was not cancelled: %s", job.id,
                            exc)
                continue
            if outcome == "cancelled":
                self.state.metrics.count_abandoned(job.model)
