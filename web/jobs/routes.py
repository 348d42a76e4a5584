"""The job API's routes: /submit, /submit/batch, /result. Each takes values out of the
request, calls inputs/queue, answers JSON.

Errors are raised, never formatted here: ``web.common.errors`` turns each into its status.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from flask import Blueprint, Response, jsonify, request

from carpool.backend.admissions import AdmitJob, AdmitRequest, single_admitted
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import (
    BackendUnavailable,
    CarpoolError,
    InvalidInput,
    NotSent,
    UnsupportedMediaType,
)
from carpool.core.jobs import Admitted, JobView, is_job_id, new_job_id
from carpool.core.settings import Settings
from carpool.intake import inputs
from web.common.auth import check_owner, request_owner, service_tier
from web.common.errors import AdmissionUnknown, error_body, retry_after_s, status_and_code
from web.common.metrics import jobs_admitted, refusing_jobs, remember_model
from web.common.post_body import read_post_body
from web.common.refusals import JobNotFound
from web.common.state import WebState, current_state
from web.results.followers import with_claim
from web.results.polls import TooManyPolls, client_gone_check
from web.results.prefer import PREFER, applied, preferred_wait_s
from web.results.waiters import await_final_after, wait_for_final
from web.results.waiting_for import waiting_for

blueprint = Blueprint("carpool", __name__)
blueprint.before_request(read_post_body)  # every POST body, read within its limits


@blueprint.post("/submit")
def submit() -> tuple[Response, int, dict[str, str]]:
    """202 with the job's id; with ``?wait=S``, 200 with its result if it ends within S."""
    state = current_state()
    owner = request_owner(state.settings)
    wait_s, prefer = _request_wait(state.settings.max_wait_s)
    sub = _read_submission(state.settings)
    deadline = time.monotonic() + wait_s
    job_id = new_job_id(sub.spec.name)
    with ExitStack() as stack:
        wait_s = _hold_poll(state, stack, owner, wait_s)
        # Watched before it is admitted: a completion that comes at once still wakes us.
        woken = stack.enter_context(state.notifier.watch(job_id)) if wait_s > 0 else None
        admitted = _admit(state, sub.spec, sub.prepared, sub.options, owner, job_id)
        state.metrics.count_submitted(admitted)
        jobs_admitted()
        view = _final_by(state, admitted, woken, deadline)
    headers = applied(wait_s) if prefer else {}
    if view is not None:
        return jsonify(view.to_json()), 200, headers
    body = _accepted(admitted)
    return jsonify(body), 202, {"Location": body["result_url"], **headers}


@blueprint.post("/submit/batch")
def submit_batch() -> tuple[Response, int, dict[str, str]]:
    """One admission per input; each input fails alone, and answers in its place.

    With ``?wait=S``: 200 when every admitted job ended within S, each in its place as
    its result document; else 202, with the result document of those that ended and
    the usual accepted item for the rest.
    """
    state = current_state()
    owner = request_owner(state.settings)
    wait_s, prefer = _request_wait(state.settings.max_wait_s)
    _require_json()
    if "Idempotency-Key" in request.headers:
        raise InvalidInput("Idempotency-Key applies to POST /submit only, not to batches")
    doc = inputs.parse_json(request.get_data())
    remember_model(doc)
    batch = inputs.batch_from_json(doc, state.settings.catalogue,
                                   state.settings.webhooks.allow_private)
    state.models.check(batch.spec.name)  # one model per batch: the same 503 as /submit
    deadline = time.monotonic() + wait_s
    with ExitStack() as stack:
        wait_s = _hold_poll(state, stack, owner, wait_s)
        jobs, watched = _admit_batch(state, batch, owner, stack, wait_s > 0)
        jobs_admitted()
        finals = [(i, _final_by(state, admitted, woken, deadline))
                  for i, (admitted, woken) in watched.items()]
    for i, view in finals:
        if view is not None:
            jobs[i] = view.to_json()
    headers = applied(wait_s) if prefer else {}
    if wait_s > 0 and watched and all(view is not None for _, view in finals):
        return jsonify({"jobs": jobs}), 200, headers
    return jsonify({"jobs": jobs}), 202, headers


def _admit_batch(
    state: WebState, batch: inputs.BatchSubmission, owner: str, stack: ExitStack, watch: bool
) -> tuple[list[dict[str, Any]], dict[int, tuple[Admitted, threading.Event | None]]]:
    """Each item's answer in order, and each admitted item's job (and event, to wait on).

    Each input is validated on its own; the valid ones are admitted together, in one
    round trip (one admit.lua call per bin), each against its bin's bound. With
    ``watch``, each job is watched before it is admitted.
    """
    items: list[dict[str, Any]] = []
    valid: list[AdmitJob] = []
    places: list[tuple[int, threading.Event | None]] = []
    for i, raw in enumerate(batch.inputs):
        try:
            prepared = inputs.prepare(batch.spec, raw, state.settings.input_limits)
        except CarpoolError as exc:
            state.metrics.count_rejected(batch.spec.name, exc)
            items.append(_item_error(exc))
            continue
        job_id = new_job_id(batch.spec.name)
        items.append({})  # its answer, once admitted or refused
        places.append((i, stack.enter_context(state.notifier.watch(job_id)) if watch else None))
        valid.append(AdmitJob(prepared.bin, job_id, prepared.input_json))
    watched: dict[int, tuple[Admitted, threading.Event | None]] = {}
    if not valid:
        return items, watched
    try:
        outcomes = state.admissions.admit(_admit_request(state, batch.spec, tuple(valid),
                                                         batch.options, owner))
    except BackendUnavailable as exc:
        refusing_jobs(len(valid))  # counted by the error handler, all of them
        # The first bin's admit.lua call failed: it may still run once Redis resumes,
        # so the 503 names its jobs' ids; later bins' calls were never sent.
        first = [job.id for job in valid if job.bin.name == valid[0].bin.name]
        raise AdmissionUnknown(first, exc, batch=True) from exc
    # Redis lost after a first bin's jobs were queued: the others say so, each (the
    # failed call's jobs with their ids: they may have been admitted).
    for (i, woken), outcome, job in zip(places, outcomes, valid, strict=True):
        items[i] = _admitted_or_refused(state, batch.spec.name, outcome, job.id)
        if isinstance(outcome, Admitted):
            watched[i] = (outcome, woken)
    return items, watched


def _hold_poll(state: WebState, stack: ExitStack, owner: str, wait_s: float) -> float:
    """``wait_s`` with one of this client's long-poll slots held on ``stack``; 0 (no
    wait: the answer is the 202) when it holds all of them (web/results/polls.py)."""
    if wait_s <= 0:
        return wait_s
    try:
        stack.enter_context(state.polls.hold(owner or request.remote_addr or ""))
    except TooManyPolls:
        return 0.0
    stack.enter_context(state.metrics.long_polls.track_inprogress())
    return wait_s


def _final_by(state: WebState, admitted: Admitted, woken: threading.Event | None,
              deadline: float) -> JobView | None:
    """The job's final view if it ends by ``deadline`` (monotonic); None otherwise."""
    if woken is None:
        return None
    gone = client_gone_check(request.environ)
    if admitted.duplicate:  # the first job's: not watched before admission, read first
        view = wait_for_final(state.reads, state.notifier, admitted.id,
                              max(0.0, deadline - time.monotonic()), gone)
    else:
        view = await_final_after(state.reads, woken, admitted.id, deadline, gone)
    return view if view is not None and view.status.is_final else None


@blueprint.get("/result/<job_id>")
def result(job_id: str) -> Response:
    state = current_state()
    owner = request_owner(state.settings)
    _require_job_id(job_id)
    wait_s, prefer = _request_wait(state.settings.max_wait_s)
    known = None
    if owner:  # another key's job must not make this request wait out its poll
        known = check_owner(state.reads.get(job_id), owner, job_id)
    if known is not None and (wait_s <= 0 or known.status.is_final):
        view: JobView | None = known  # that read answers: a final job stays final
    elif wait_s <= 0:
        view = state.reads.get(job_id)
    else:
        # Registered after the owner check's read: a job pending now had not ended by
        # then, so the wait comes first (web/results/waiters.py); else it reads again.
        with state.polls.hold(owner or request.remote_addr or ""), \
                state.metrics.long_polls.track_inprogress():
            view = wait_for_final(state.reads, state.notifier, job_id, wait_s,
                                  client_gone_check(request.environ))
    found = with_claim(check_owner(view, owner, job_id), state.notifier.claim_of(job_id))
    answer = jsonify({**found.to_json(),
                      **waiting_for(state.models, found, state.settings.refused_grace_s)})
    if prefer:
        answer.headers.update(applied(wait_s))
    return answer


@blueprint.delete("/result/<job_id>")
def delete_result(job_id: str) -> Response:
    """Cancel a queued job, or delete a finished one; 409 while it runs."""
    state = current_state()
    owner = request_owner(state.settings)
    _require_job_id(job_id)
    view = check_owner(state.queue.get(job_id), owner, job_id)
    outcome = state.queue.cancel(job_id, state.settings.catalogue.result_ttl_s(view.model))
    state.notifier.forget(job_id)  # a GET here next must not answer its pushed view
    if outcome == "cancelled":
        return jsonify({"id": job_id, "status": "cancelled"})
    if outcome == "deleted":
        return jsonify({"id": job_id, "deleted": True})
    raise JobNotFound(f"no job {job_id}: it expired just now")


def _read_submission(settings: Settings) -> inputs.Submission:
    catalogue, allow_private = settings.catalogue, settings.webhooks.allow_private
    header_key = request.headers.get("Idempotency-Key")
    mimetype = request.mimetype
    if mimetype == "multipart/form-data":
        files = request.files
        if set(files) != {"file"} or len(files.getlist("file")) != 1:
            raise InvalidInput("send exactly one file, in the form field 'file'")
        data = files["file"].read()
        return inputs.submission_from_file(request.form.to_dict(), data, catalogue, header_key,
                                           allow_private)
    if mimetype.startswith("image/"):
        fields = {k: v for k, v in request.args.items() if k != "wait"}  # ?wait= is ours
        return inputs.submission_from_file(fields, request.get_data(),
                                           catalogue, header_key, allow_private)
    _require_json()
    doc = inputs.parse_json(request.get_data())
    remember_model(doc)
    return inputs.submission_from_json(doc, catalogue, settings.input_limits, header_key,
                                       allow_private)


def _require_json() -> None:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type {request.mimetype or '(none)'!r} is not accepted here: send "
            "application/json, multipart/form-data with a 'file', or image/* with ?model="
        )


def _admit(state: WebState, spec: ModelSpec, prepared: inputs.Prepared,
           options: inputs.Options, owner: str, job_id: str) -> Admitted:
    """Admit under ``job_id``; a 503 then names it: the job may have been admitted."""
    state.models.check(spec.name)  # 503 at once for a model every live worker refused
    try:
        return _admit_as(state, spec, prepared, options, owner, job_id)
    except BackendUnavailable as exc:
        raise AdmissionUnknown([job_id], exc) from exc


def _admit_as(state: WebState, spec: ModelSpec, prepared: inputs.Prepared,
              options: inputs.Options, owner: str, job_id: str) -> Admitted:
    idempotency_digest = options.idempotency_digest(owner)
    job = AdmitJob(prepared.bin, job_id, prepared.input_json)
    admit_request = _admit_request(state, spec, (job,), options, owner)
    if idempotency_digest is not None:
        admit_request = replace(admit_request, idempotency_digest=idempotency_digest,
                                input_digest=prepared.digest())
    return single_admitted(state.admissions.admit(admit_request))


def _admit_request(state: WebState, spec: ModelSpec, jobs: tuple[AdmitJob, ...],
                   options: inputs.Options, owner: str) -> AdmitRequest:
    """``jobs`` with the options of their submission."""
    return AdmitRequest(spec, jobs, state.settings.queued_ttl_s, options.deadline_ms,
                        options.priority, owner, state.settings.api_key_weights.get(owner, 1.0),
                        hook=options.hook,
                        tier=service_tier(state.settings, owner, options.service_tier))


def _accepted(admitted: Admitted) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": admitted.id, "status": "queued", "model": admitted.model, "bin": admitted.bin,
        "result_url": f"/result/{admitted.id}",
    }
    if admitted.duplicate:
        body["duplicate"] = True
    return body


def _admitted_or_refused(state: WebState, model: str, outcome: Admitted | CarpoolError,
                         job_id: str) -> dict[str, Any]:
    if isinstance(outcome, BackendUnavailable) and not isinstance(outcome, NotSent):
        outcome = AdmissionUnknown([job_id], outcome)  # its call was sent: it may run
    if isinstance(outcome, CarpoolError):
        state.metrics.count_rejected(model, outcome)
        return _item_error(outcome)
    state.metrics.count_submitted(outcome)
    return _accepted(outcome)


def _item_error(exc: CarpoolError) -> dict[str, Any]:
    status, code = status_and_code(exc)
    item = {**error_body(code, str(exc), exc), "status": status}
    retry = retry_after_s(exc)
    if retry is not None:  # what the Retry-After header says for a single submit
        item["retry_after_s"] = retry
    return item


def _require_job_id(job_id: str) -> None:
    if not is_job_id(job_id):  # never a Redis lookup for garbage
        raise JobNotFound(f"no job {job_id[:64]!r}: not a job id")


def _request_wait(max_wait_s: float) -> tuple[float, bool]:
    """The long-poll this request asks for: ``?wait=`` if given, else ``Prefer: wait=``
    (web/results/prefer.py); and whether it came from ``Prefer`` (answered with
    ``Preference-Applied``)."""
    raw = request.args.get("wait")
    if raw is None:
        preferred = preferred_wait_s(request.headers.get(PREFER), max_wait_s)
        if preferred is not None:
            return preferred, True
    return _wait_s(raw, max_wait_s), False


def _wait_s(raw: str | None, max_wait_s: float) -> float:
    if raw is None:
        return 0.0
    try:
        wait_s = float(raw)
    except ValueError:
        wait_s = math.nan
    if not 0 <= wait_s <= max_wait_s:  # also refuses nan
        raise InvalidInput(f"wait must be seconds between 0 and {max_wait_s:g}, got {raw[:40]!r}")
    return wait_s
