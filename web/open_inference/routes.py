"""The Open Inference Protocol (KServe v2, HTTP/REST): what Triton's clients and load
tools call, in front of the same admission as ``POST /submit`` (docs/v2.md).

An infer request is one job per row, admitted in one ``Admissions.admit`` call (one
admit.lua call per bin, each against its bin's bound), waited for the same way as
``POST /submit?wait`` (web/common/sync_wait.py: a poll slot; a hang-up cancels its
queued rows), and answered when every row has ended, rows in order. A refused row
refuses the request: the rows admitted with it are cancelled, and the answer is the
refusal's 429/503 with ``Retry-After``. Errors are the protocol's
``{"error": "<message>"}`` with carpool's status for each.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Request, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

import carpool
from carpool.backend.admissions import AdmitJob
from carpool.backend.repository import READY, model_state
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import (
    CarpoolError,
    InvalidInput,
    ModelRefused,
    UnknownModel,
)
from carpool.core.jobs import MODEL_UNAVAILABLE, JobStatus, JobView, new_job_id
from carpool.core.versions import SEPARATOR, internal_name, versions_of
from carpool.intake import inputs
from web.common.auth import request_owner
from web.common.errors import retry_after_s, status_and_code
from web.common.lean import Answer, LeanRoute, flask_answer
from web.common.metrics import remember_model
from web.common.state import WebState, current_state
from web.common.sync_wait import SyncWait
from web.open_inference.model import (
    JobOptions,
    config,
    job_inputs,
    job_options,
    metadata,
    output_data,
    requested_outputs,
    statistics,
    tensors_of,
)
from web.open_inference.tensors import encode_output, parse_request

log = logging.getLogger(__name__)

blueprint = Blueprint("v2", __name__, url_prefix="/v2")
#: Extensions of the protocol that carpool speaks (GET /v2).
EXTENSIONS = ("binary_tensor_data", "model_configuration", "parameters")
#: Past a request's own deadline, how long its answer may still take to come back.
ANSWER_GRACE_S = 1.0
#: The shortest wait of an infer request, whatever CARPOOL_MAX_WAIT_S says: the protocol
#: answers inline, so MAX_WAIT_S=0 (no long-polls) still serves fast models; under
#: gunicorn's graceful margin past MAX_WAIT_S (web/gunicorn_conf.py), so a graceful stop
#: still lets it finish.
MIN_INFER_WAIT_S = 5.0
#: The header that splits a body into its JSON and its binary tensors.
HEADER_LENGTH = "Inference-Header-Content-Length"


class ResultTimeout(CarpoolError):
    """Raised when an infer request's jobs have not all ended within its wait."""


class JobFailed(CarpoolError):
    """Raised when one of an infer request's jobs failed in the model."""


class NotServed(InvalidInput):
    """Raised when a model's readiness is asked and no live worker serves it."""


@blueprint.get("")
def server_metadata() -> Response:
    return jsonify({"name": "carpool", "version": carpool.__version__,
                    "extensions": list(EXTENSIONS)})


# The health answers carry the REST spec's bodies ({"live": true}), which KServe's
# client reads; Triton answers with an empty body, and its clients read the status only.
@blueprint.get("/health/live")
def live() -> Response:
    return jsonify({"live": True})


@blueprint.get("/health/ready")
def ready() -> Response:
    current_state().queue.ping()  # BackendUnavailable answers 503
    return jsonify({"ready": True})


# Each model route also answers under /versions/<v>: that version's own entry
# (docs/deployments.md); without it, the model's own entry.
@blueprint.get("/models/<name>")
@blueprint.get("/models/<name>/versions/<version>")
def model_metadata(name: str, version: str | None = None) -> Response:
    spec = _model(name, version)
    models = current_state().settings.catalogue.models
    return jsonify(metadata(spec, [spec.version] if version or spec.family
                            else versions_of(models, spec.name)))


@blueprint.get("/models/<name>/ready")
@blueprint.get("/models/<name>/versions/<version>/ready")
def model_ready(name: str, version: str | None = None) -> Response:
    """200 while the model is loaded and a live worker serves it; 400 otherwise, as
    Triton answers. Read fresh, not from the admission's cache: a client asks right
    after a load or an unload."""
    spec = _model(name, version)
    state = current_state()
    found, why = model_state(spec.name, state.repository.read([spec.name])[spec.name],
                             state.models.registry.live())
    if found == READY:
        return jsonify({"name": spec.base_name, "ready": True})
    raise NotServed(f"model {spec.name!r} is not ready: {found}" + (f", {why}" if why else "")
                    + " (POST /v2/repository/index lists every model's state)")


@blueprint.get("/models/<name>/config")
@blueprint.get("/models/<name>/versions/<version>/config")
def model_config(name: str, version: str | None = None) -> Response:
    spec = _model(name, version)
    return jsonify(config(spec, current_state().models.availability(spec.name).served_by))


@blueprint.get("/models/stats")
@blueprint.get("/models/<name>/stats")
@blueprint.get("/models/<name>/versions/<version>/stats")
def model_stats(name: str | None = None, version: str | None = None) -> Response:
    """The statistics extension, as far as carpool counts: jobs ended (perf_analyzer
    reads it around each measurement); times are carpool's own, in /metrics. Without a
    model, every entry of the catalogue (``get_inference_statistics()``, as Triton)."""
    state = current_state()
    specs = list(state.settings.catalogue) if name is None else [_model(name, version)]
    bins = [(spec.name, b.name) for spec in specs for b in spec.bins]
    ended = iter(state.queue.drained(bins))
    return jsonify({"model_stats": [
        statistics(spec, sum(next(ended) for _ in spec.bins)) for spec in specs]})


@blueprint.post("/models/<name>/infer")
@blueprint.post("/models/<name>/versions/<version>/infer")
def infer(name: str, version: str | None = None) -> Response:
    return flask_answer(infer_answer(request, name, version))


def infer_answer(req: Request, name: str, version: str | None = None) -> Answer:
    """An infer request's answer, by Flask or the lean routes (web/common/lean.py)."""
    state = current_state()
    # Refusals count under the model it names.
    remember_model({"model": name if version is None else internal_name(name, version)})
    owner = request_owner(state.settings, req)
    infer = parse_request(req.get_data(), req.headers.get(HEADER_LENGTH))
    # A version in the path or the body pins it; else the model's rollout picks one.
    pinned = infer.model_version if isinstance(infer.model_version, str) else None
    spec = _model(name, version or pinned or None, routed=True)
    tensors = tensors_of(spec)
    if (infer.model_name not in (None, spec.name, spec.base_name)
            or infer.model_version not in (None, "", spec.version)):
        raise InvalidInput(f"the body names model {str(infer.model_name)[:64]!r} version "
                           f"{str(infer.model_version)[:20]!r}, the path {spec.base_name!r} "
                           f"version {spec.version!r}: send one, or the same")
    options = job_options(spec, infer.parameters, state.settings.webhooks.allow_private)
    outputs = requested_outputs(tensors, infer)
    prepared = []
    for i, job_input in enumerate(job_inputs(spec, tensors, infer)):
        try:
            prepared.append(inputs.prepare(spec, job_input, state.settings.input_limits))
        except CarpoolError as exc:
            exc.args = (f"row {i}: {exc}",)
            raise
    views = _run(state, spec, prepared, options, owner, req)
    body: dict[str, Any] = {"model_name": spec.base_name, "model_version": spec.version}
    if infer.id is not None:
        body["id"] = infer.id
    body["parameters"] = {"carpool_job_ids": [v.id for v in views]}
    entries, parts = [], []
    for declared, binary in outputs:
        shape, data = output_data(declared, [v.result for v in views])
        entry, raw = encode_output(declared.name, declared.datatype, shape, data, binary)
        entries.append(entry)
        parts.append(raw)
    body["outputs"] = entries
    return Answer(body, binary=b"".join(parts), binary_header=HEADER_LENGTH)


def _run(state: WebState, spec: ModelSpec, prepared: list[inputs.Prepared],
         options: JobOptions, owner: str, req: Request) -> list[JobView]:
    """Admit one job per row and wait for them all: their final views, in order. A
    refused row refuses the request: the rows admitted with it are cancelled."""
    # Never past CARPOOL_MAX_WAIT_S (floored): a long timeout would otherwise hold a
    # greenlet and a poll slot past gunicorn's graceful stop.
    cap_s = max(state.settings.max_wait_s, MIN_INFER_WAIT_S)
    wait_s = (min(options.deadline_ms / 1000 + ANSWER_GRACE_S, cap_s) if options.deadline_ms
              else cap_s)
    jobs = tuple(AdmitJob(p.bin, new_job_id(spec.name), p.input_json) for p in prepared)
    with SyncWait(state, owner, wait_s, slot_required=True, req=req) as sync:
        admitted = sync.admit_all(sync.request(spec, jobs, options))
        views = sync.finals(admitted)
    for view, job in zip(views, admitted, strict=True):
        if view is None:
            raise ResultTimeout(
                f"job {job.id} (and its request's other rows) had not ended within "
                f"{sync.wait_s:g} s; GET /result/<id> tells each: "
                + ", ".join(j.id for j in admitted))
        if view.status is not JobStatus.DONE:
            raise _job_error(view)
    return [v for v in views if v is not None]


def _job_error(view: JobView) -> CarpoolError:
    message = f"job {view.id} ended {view.status.value}: {view.error or 'no reason given'}"
    if view.status is JobStatus.EXPIRED:
        return ResultTimeout(message)
    if view.error is not None and view.error.startswith("invalid_input"):
        return InvalidInput(message)
    if view.error is not None and view.error.startswith(MODEL_UNAVAILABLE):
        return ModelRefused(message)  # 503: refused by every worker, or unloaded
    return JobFailed(message)


def _model(name: str, version: str | None, routed: bool = False) -> ModelSpec:
    """The entry a path names: ``<m>`` (or ``<m>@<v>``), and its version if it says;
    ``routed``: the one a job of it goes to (web/common/routing.py)."""
    state = current_state()
    catalogue = state.routing.catalogue() if routed else state.settings.catalogue
    if version is None:
        return catalogue.get(name)
    if SEPARATOR in name:
        raise UnknownModel(f"model {name[:64]!r} under /versions/{version[:20]}: name the "
                           f"version once, in the path (/v2/models/<m>/versions/<v>)")
    return catalogue.get(internal_name(name, version))


#: The methods the catch-all below takes: any of them on a known path is that path's.
_CAUGHT_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
#: Every method a route may take (Flask adds HEAD to GET, OPTIONS to all).
_ANY_METHOD = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


@blueprint.route("/<path:rest>", methods=list(_CAUGHT_METHODS))
def unknown(rest: str) -> Response:
    # The catch-all takes every path, so Flask never finds that a known path was asked
    # with another method: a GET on .../infer would be "no such endpoint", not a 405.
    allowed = _methods_of(request)
    if allowed:
        raise MethodNotAllowed(valid_methods=allowed)
    raise NotFound(f"no such endpoint /v2/{rest[:80]} (docs/v2.md lists them)")


def _methods_of(req: Request) -> list[str]:
    """The methods another route of the app takes at ``req``'s path (none: unknown)."""
    adapter = current_app.url_map.bind_to_environ(req.environ)
    allowed = []
    for method in _ANY_METHOD:
        try:
            endpoint, _ = adapter.match(req.path, method=method)
        except HTTPException:  # no route takes it (or a redirect to another path)
            continue
        if endpoint != req.endpoint:
            allowed.append(method)
    return allowed


#: Statuses of this module's own errors (the rest: web/common/refusals.py's table).
_OWN_STATUS = {ResultTimeout: 504, NotServed: 400, JobFailed: 500}


@blueprint.errorhandler(CarpoolError)
def carpool_error(exc: CarpoolError, req: Request = request
                  ) -> tuple[Response, int, dict[str, str]]:
    # Flask passes the error alone (its request is the proxy); the lean routes theirs.
    current_state().metrics.count_refused_request(exc, req)
    status = next((s for cls, s in _OWN_STATUS.items() if isinstance(exc, cls)), None)
    if status is None:
        status, _ = status_and_code(exc)
    if status >= 500 and status not in (503, 504):
        log.warning("v2 request answered %d: %s", status, exc)
    headers = {}
    retry = retry_after_s(exc)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="carpool"'
    return jsonify({"error": str(exc)}), status, headers


@blueprint.errorhandler(HTTPException)
def http_error(exc: HTTPException, req: Request = request
               ) -> tuple[Response, int, dict[str, str]]:
    current_state().metrics.count_refused_request(exc, req)
    # A 405 says which methods would work, as the app's own handler does.
    allow = {k: v for k, v in exc.get_headers() if k.lower() == "allow"}
    return jsonify({"error": exc.description or exc.name}), exc.code or 500, allow


@blueprint.errorhandler(Exception)
def unexpected(exc: Exception) -> tuple[Response, int]:
    log.exception("v2: unhandled error", exc_info=exc)
    return jsonify({"error": "internal error; see the server log"}), 500


def protocol_error_answer(exc: Exception, req: Request) -> ResponseReturnValue:
    """What this blueprint's handlers answer ``exc`` with (its lean routes' errors)."""
    if isinstance(exc, CarpoolError):
        return carpool_error(exc, req)
    if isinstance(exc, HTTPException):
        return http_error(exc, req)
    return unexpected(exc)


#: The routes every infer request takes, answered in front of Flask's dispatch.
LEAN_ROUTES = tuple(LeanRoute("POST", path, "v2.infer", infer_answer,
                              errors=protocol_error_answer)
                    for path in ("/v2/models/<name>/infer",
                                 "/v2/models/<name>/versions/<version>/infer"))
