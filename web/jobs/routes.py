"""The job API's routes: /submit, /submit/batch, /result. Each takes values out of the
request, calls inputs/queue, answers JSON.

Errors are raised, never formatted here: ``web.common.errors`` turns each into its status.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from flask import Blueprint, Request, Response, jsonify, request

from carpool.backend.admissions import AdmitJob
from carpool.core.catalogue import Catalogue
from carpool.core.errors import (
    BackendUnavailable,
    CarpoolError,
    InvalidInput,
    NotSent,
    UnsupportedMediaType,
)
from carpool.core.jobs import (
    Admitted,
    JobView,
    idempotency_digest,
    is_job_id,
    model_version,
    new_job_id,
)
from carpool.core.strict_json import parse_json
from carpool.core.versions import split
from carpool.intake import inputs
from web.common.auth import check_owner, request_owner
from web.common.bodies import multipart_parts
from web.common.errors import AdmissionUnknown, error_body, retry_after_s, status_and_code
from web.common.lean import Answer, LeanRoute, flask_answer
from web.common.metrics import jobs_admitted, remember_model
from web.common.refusals import JobNotFound
from web.common.state import WebState, current_state
from web.common.sync_wait import SyncWait
from web.results.followers import with_claim
from web.results.polls import client_gone_check
from web.results.prefer import PREFER, applied, preferred_wait_s
from web.results.waiters import wait_for_final
from web.results.waiting_for import waiting_for

blueprint = Blueprint("carpool", __name__)


@blueprint.post("/submit")
def submit() -> Response:
    """202 with the job's id; with ``?wait=S``, 200 with its result if it ends within S."""
    return flask_answer(submit_answer(request))


def submit_answer(req: Request) -> Answer:
    """``POST /submit``'s answer; a JSON body's comes by the lean routes (web/common/lean.py)."""
    state = current_state()
    owner = request_owner(state.settings, req)
    wait_s, prefer = _request_wait(state.settings.max_wait_s, req)
    sub = _read_submission(state, owner, req)
    job = AdmitJob(sub.prepared.bin, new_job_id(sub.spec.name), sub.prepared.input_json)
    with SyncWait(state, owner, wait_s, req=req) as sync:
        admit_request = sync.request(sub.spec, (job,), sub.options, sub.options.service_tier)
        digest = sub.options.idempotency_digest(owner)
        if digest is not None:
            admit_request = replace(admit_request, idempotency_digest=digest,
                                    input_digest=sub.prepared.digest())
        admitted = sync.admit_one(admit_request)
        (view,) = sync.finals([admitted])
    headers = applied(sync.wait_s) if prefer else {}
    if view is not None:
        return Answer(view.to_json(), 200, headers)
    body = _accepted(admitted)
    return Answer(body, 202, {"Location": body["result_url"], **headers})


@blueprint.post("/submit/batch")
def submit_many() -> tuple[Response, int, dict[str, str]]:
    """One admission per input; each input fails alone, and answers in its place.

    With ``?wait=S``: 200 when every admitted job ended within S, each in its place as
    its result document; else 202, with the result document of those that ended and
    the usual accepted item for the rest.
    """
    state = current_state()
    owner = request_owner(state.settings, request)
    wait_s, prefer = _request_wait(state.settings.max_wait_s, request)
    _require_json(request)
    if "Idempotency-Key" in request.headers:
        raise InvalidInput("Idempotency-Key applies to POST /submit only, not to /submit/batch")
    doc = parse_json(request.get_data())
    remember_model(doc)
    many = inputs.many_from_json(doc, state.routing.catalogue(),
                                 state.settings.webhooks.allow_private)
    state.models.check(many.spec.name)  # one model per request: the same 503 as /submit
    with SyncWait(state, owner, wait_s, req=request) as sync:
        jobs, admitted = _admit_many(state, sync, many)
        jobs_admitted(request)
        finals = sync.finals(list(admitted.values()))
    for i, view in zip(admitted, finals, strict=True):
        if view is not None:
            jobs[i] = view.to_json()
    headers = applied(sync.wait_s) if prefer else {}
    if sync.wait_s > 0 and admitted and all(view is not None for view in finals):
        return jsonify({"jobs": jobs}), 200, headers
    return jsonify({"jobs": jobs}), 202, headers


def _admit_many(state: WebState, sync: SyncWait, many: inputs.ManySubmission,
                ) -> tuple[list[dict[str, Any]], dict[int, Admitted]]:
    """Each item's answer in order, and each admitted item's job by its place.

    Each input is validated on its own; the valid ones are admitted together, in one
    round trip (one admit.lua call per bin), each against its bin's bound.
    """
    items: list[dict[str, Any]] = []
    valid: list[AdmitJob] = []
    places: list[int] = []
    for i, raw in enumerate(many.inputs):
        try:
            prepared = inputs.prepare(many.spec, raw, state.settings.input_limits)
        except CarpoolError as exc:
            state.metrics.count_rejected(many.spec.name, exc)
            items.append(_item_error(exc))
            continue
        items.append({})  # its answer, once admitted or refused
        places.append(i)
        valid.append(AdmitJob(prepared.bin, new_job_id(many.spec.name), prepared.input_json))
    admitted: dict[int, Admitted] = {}
    if not valid:
        return items, admitted
    outcomes = sync.admit(sync.request(many.spec, valid, many.options,
                                       many.options.service_tier))
    # Redis lost after a first bin's jobs were queued: the others say so, each (the
    # failed call's jobs with their ids: they may have been admitted).
    for i, outcome, job in zip(places, outcomes, valid, strict=True):
        items[i] = _admitted_or_refused(state, sync, many.spec.name, outcome, job.id)
        if isinstance(outcome, Admitted):
            admitted[i] = outcome
    return items, admitted


@blueprint.get("/result/<job_id>")
def result(job_id: str) -> Response:
    return flask_answer(result_answer(request, job_id))


def result_answer(req: Request, job_id: str) -> Answer:
    """``GET /result/<id>``'s answer, by Flask or the lean routes (web/common/lean.py)."""
    state = current_state()
    owner = request_owner(state.settings, req)
    _require_job_id(job_id)
    wait_s, prefer = _request_wait(state.settings.max_wait_s, req)
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
        with state.polls.hold(owner or req.remote_addr or ""), \
                state.metrics.long_polls.track_inprogress():
            view = wait_for_final(state.reads, state.notifier, job_id, wait_s,
                                  client_gone_check(req.environ))
    found = with_claim(check_owner(view, owner, job_id), state.notifier.claim_of(job_id))
    return Answer({**found.to_json(),
                   **waiting_for(state.models, found, state.settings.refused_grace_s)},
                  200, applied(wait_s) if prefer else {})


@blueprint.delete("/result/<job_id>")
def delete_result(job_id: str) -> Response:
    """Cancel a queued job, or delete a finished one; 409 while it runs."""
    state = current_state()
    owner = request_owner(state.settings, request)
    _require_job_id(job_id)
    view = check_owner(state.queue.get(job_id), owner, job_id)
    outcome = state.queue.cancel(job_id, state.settings.catalogue.result_ttl_s(view.model))
    state.notifier.forget(job_id)  # a GET here next must not answer its pushed view
    if outcome == "cancelled":
        return jsonify({"id": job_id, "status": "cancelled"})
    if outcome == "deleted":
        return jsonify({"id": job_id, "deleted": True})
    raise JobNotFound(f"no job {job_id}: it expired just now")


#: The routes every job takes, answered in front of Flask's dispatch (web/common/lean.py).
LEAN_ROUTES = (LeanRoute("POST", "/submit", "carpool.submit", submit_answer, "application/json"),
               LeanRoute("GET", "/result/<job_id>", "carpool.result", result_answer))


def _read_submission(state: WebState, owner: str, req: Request) -> inputs.Submission:
    """The request's one job, its model routed (web/common/routing.py): by its
    idempotency key when it has one, so that a retry goes where the first went."""
    settings = state.settings
    allow_private = settings.webhooks.allow_private
    header_key = req.headers.get("Idempotency-Key")
    mimetype = req.mimetype
    if mimetype == "multipart/form-data":
        form, files = multipart_parts(req)
        if [name for name, _ in files] != ["file"]:
            raise InvalidInput("send exactly one file, in the form field 'file'")
        data = files[0][1].read()
        return inputs.submission_from_file(
            form, data, _routed(state, owner, form.get("idempotency_key"), header_key),
            header_key, allow_private)
    if mimetype.startswith("image/"):
        fields = {k: v for k, v in req.args.items() if k != "wait"}  # ?wait= is ours
        return inputs.submission_from_file(
            fields, req.get_data(),
            _routed(state, owner, fields.get("idempotency_key"), header_key), header_key,
            allow_private)
    _require_json(req)
    doc = parse_json(req.get_data())
    remember_model(doc)
    body_key = doc.get("idempotency_key") if isinstance(doc, dict) else None
    return inputs.submission_from_json(doc, _routed(state, owner, body_key, header_key),
                                       settings.input_limits, header_key, allow_private)


def _routed(state: WebState, owner: str, body_key: object, header_key: str | None
            ) -> Catalogue:
    key = body_key if body_key is not None else header_key
    # A malformed key is refused by the parse (400): none picks a version meanwhile.
    try:
        digest = idempotency_digest(key, owner) if isinstance(key, str) else None
    except UnicodeEncodeError:  # an unpaired surrogate
        digest = None
    return state.routing.catalogue(digest)


def _require_json(req: Request) -> None:
    if req.mimetype != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type {req.mimetype or '(none)'!r} is not accepted here: send "
            "application/json, multipart/form-data with a 'file', or image/* with ?model="
        )


def _accepted(admitted: Admitted) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": admitted.id, "status": "queued", "model": split(admitted.model)[0],
        "model_version": model_version(admitted.model, None, current_state().queue.versions),
        "bin": admitted.bin, "result_url": f"/result/{admitted.id}",
    }
    if admitted.duplicate:
        body["duplicate"] = True
    return body


def _admitted_or_refused(state: WebState, sync: SyncWait, model: str,
                         outcome: Admitted | CarpoolError, job_id: str) -> dict[str, Any]:
    if isinstance(outcome, BackendUnavailable) and not isinstance(outcome, NotSent):
        outcome = AdmissionUnknown([job_id], outcome)  # its call was sent: it may run
    if isinstance(outcome, CarpoolError):
        state.metrics.count_rejected(model, outcome)
        return _item_error(outcome)
    sync.took(outcome)
    return _accepted(outcome)


def _item_error(exc: CarpoolError) -> dict[str, Any]:
    status, code = status_and_code(exc)
    item = {**error_body(code, str(exc), exc, status), "status": status}
    retry = retry_after_s(exc)
    if retry is not None:  # what the Retry-After header says for a single submit
        item["retry_after_s"] = retry
    return item


def _require_job_id(job_id: str) -> None:
    if not is_job_id(job_id):  # never a Redis lookup for garbage
        raise JobNotFound(f"no job {job_id[:64]!r}: not a job id")


def _request_wait(max_wait_s: float, req: Request) -> tuple[float, bool]:
    """The long-poll this request asks for: ``?wait=`` if given, else ``Prefer: wait=``
    (web/results/prefer.py); and whether it came from ``Prefer`` (answered with
    ``Preference-Applied``)."""
    raw = req.args.get("wait")
    if raw is None:
        preferred = preferred_wait_s(req.headers.get(PREFER), max_wait_s)
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
