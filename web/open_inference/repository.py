"""Triton's model repository extension: the index, load and unload (docs/v2.md), on the
desired states in Redis (carpool/backend/repository.py).

``POST /v2/repository/index`` lists every catalogue entry (each version of each model)
with its state. A load or an unload of ``<m>`` acts on every version of ``m``, as
Triton's does; of ``<m>@<v>`` on that version alone. A load starts a new generation of
each entry (or joins the one in progress: two loads at once load once) and answers once
none is loading, as Triton's does: 200 when a live worker serves one at least; 400 with
the worker's reason when every one that may serve an entry refused it; 503 when no live
worker may serve any (they stay loaded: the next that starts loads them); 504 when one
is still loading after the wait. An unload answers at once: new jobs are refused (503
model_unavailable), queued jobs end failed with the reason, and workers finish their
claimed batches, then free the model. With API keys on, only an ``admin`` key changes
models.
"""

from __future__ import annotations

import logging
import time
from dataclasses import fields
from typing import Any
from urllib.parse import quote

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from carpool.backend.repository import (
    IN_PROGRESS,
    LOADING,
    NO_WORKER,
    READY,
    REFUSED,
    UNAVAILABLE,
    load_outcome,
    model_state,
    unsettled,
)
from carpool.core.catalogue import Catalogue, ModelSpec
from carpool.core.errors import CarpoolError, ConfigError, InvalidInput, ModelRefused
from carpool.core.kinds import kind_of
from carpool.core.overrides import canonical, overridden, parse_override
from carpool.core.settings import Settings
from carpool.core.strict_json import parse_json
from carpool.core.tokens import TokenizerConfig
from carpool.core.versions import SEPARATOR, internal_name
from carpool.intake.inputs import input_limits
from web.common.auth import request_owner
from web.common.refusals import Forbidden
from web.common.state import WebState, current_state
from web.open_inference.routes import MIN_INFER_WAIT_S, carpool_error, http_error, unexpected

log = logging.getLogger(__name__)

blueprint = Blueprint("v2_repository", __name__, url_prefix="/v2/repository")
blueprint.register_error_handler(HTTPException, http_error)
blueprint.register_error_handler(Exception, unexpected)
#: What a load's override may change: what only the workers read. The rest (bins,
#: limits, schema, tensors, tokenizer) is what the web admits jobs by, read by every
#: web and feeder process at its start from the catalogue file.
WORKER_FIELDS = frozenset({"options", "handler"})
#: How often a load's answer rereads the registry while the workers load: an admin's
#: rare call, waiting on workers that say so in their heartbeat (no change notice).
LOAD_POLL_S = 0.1


class BadOverride(InvalidInput):
    """Raised when a load's ``parameters.config`` is not a valid override (400)."""


class LoadFailed(InvalidInput):
    """Raised when every live worker that may serve a model refused its load (400)."""


class NoWorkerLoaded(ModelRefused):
    """Raised when no live worker may serve a model a load asked for (503)."""


class LoadTimeout(CarpoolError):
    """Raised when a model is still loading at the end of a load's wait (504)."""


@blueprint.post("/index")
def index() -> Response:
    """Every catalogue entry, ``{"name", "version", "state"[, "reason"]}`` (``m@v`` as
    name ``m``, version ``v``); with ``{"ready": true}``, the READY ones only."""
    state = current_state()
    request_owner(state.settings, request)  # any known key reads it
    only_ready = _body().get("ready") is True
    specs = list(state.settings.catalogue)
    desired = state.repository.read([spec.name for spec in specs])
    live = state.models.registry.live()
    out = []
    for spec in specs:
        found, reason = model_state(spec.name, desired[spec.name], live)
        if only_ready and found != READY:
            continue
        out.append({"name": spec.base_name, "version": spec.version, "state": found,
                    **({"reason": reason} if reason else {})})
    return jsonify(out)


@blueprint.post("/models/<name>/load")
def load(name: str) -> Response:
    state = current_state()
    _admin(state.settings)
    specs = versions_addressed(state.settings.catalogue, name)
    doc = _override(specs[0], _body().get("parameters"))
    if doc and len(specs) > 1:
        raise BadOverride(
            f"model {name!r} has versions {', '.join(s.version for s in specs)}: a load with "
            f"parameters.config names one, {internal_name(name, specs[-1].version)!r} "
            f"(URL-encoded {quote(internal_name(name, specs[-1].version))!r})")
    live = state.models.registry.live()
    current = state.repository.read([spec.name for spec in specs])
    generations = {}
    for spec in specs:
        was = current[spec.name].generation
        seen = IN_PROGRESS if unsettled(live, spec.name, was) else was
        generations[spec.name], started = state.repository.load(spec.name, canonical(doc), seen)
        log.info("model %r: load %s generation %d", spec.name,
                 "started" if started else "joined", generations[spec.name])
    outcomes = _wait_loaded(state, generations)
    return jsonify({"name": specs[0].base_name, "state": READY, "versions": [
        {"version": spec.version, "state": outcomes[spec.name][0],
         **({"reason": outcomes[spec.name][1]} if outcomes[spec.name][1] else {})}
        for spec in specs]})


@blueprint.post("/models/<name>/unload")
def unload(name: str) -> Response:
    state = current_state()
    _admin(state.settings)
    specs = versions_addressed(state.settings.catalogue, name)
    _body()  # Triton's unload_dependents: carpool's models have no dependents
    ended = 0
    for spec in specs:
        generation, changed = state.repository.unload(spec.name)
        ended_here = state.repository.end_queued(spec)
        if changed or ended_here:
            log.info("model %r unloaded (generation %d): %d queued jobs ended", spec.name,
                     generation, ended_here)
        ended += ended_here
    return jsonify({"name": specs[0].base_name, "versions": [spec.version for spec in specs],
                    "state": UNAVAILABLE, "reason": "unloaded", "queued_jobs_ended": ended})


def versions_addressed(catalogue: Catalogue, name: str) -> list[ModelSpec]:
    """The entries a load or unload of ``name`` acts on: ``<m>@<v>``, that version's;
    ``<m>``, every version of ``m`` (its own entry first), as Triton's load and unload
    act on every version of a model."""
    spec = catalogue.get(name)
    if SEPARATOR in name:
        return [spec]
    return [spec, *sorted((s for s in catalogue if s.family == spec.name),
                          key=lambda s: s.version)]


def _admin(settings: Settings) -> None:
    """With API keys on, only a key marked ``admin`` in the keys file changes models."""
    owner = request_owner(settings, request)
    policy = settings.api_key_policies.get(owner) if owner else None
    if owner and not (policy is not None and policy.admin):
        raise Forbidden("loading and unloading models needs an admin key (mark it "
                        "`admin` in CARPOOL_API_KEYS_FILE)")


def _body() -> dict[str, Any]:
    """The request's JSON object; an empty body is ``{}`` (tritonclient sends one)."""
    raw = request.get_data()
    if not raw.strip():
        return {}
    doc = parse_json(raw)
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object")
    return doc


def _override(base: ModelSpec, parameters: object) -> dict[str, Any]:
    """A load's override, checked: valid as a catalogue entry of ``base``'s model, and
    changing only what the workers alone read."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInput("parameters must be a JSON object")
    files = sorted(k for k in parameters if k.startswith("file:"))
    if files:
        raise InvalidInput(f"carpool loads no model files over the API ({files[0]}): put "
                           "them where the workers read them, and name them in "
                           "parameters.config's options")
    if "config" not in parameters:
        return {}
    try:
        doc = parse_override(parameters["config"])
        spec = overridden(base, doc)
        changed = _web_changes(base, spec)
    except ConfigError as exc:
        raise BadOverride(f"parameters.config: {exc}") from None
    if changed:
        raise BadOverride(
            f"parameters.config changes {', '.join(changed)} of model {base.name!r}, which "
            "the web admits jobs by: change that in the catalogue file (CARPOOL_CONFIG) and "
            "restart; a load may change what only the workers read: options (weights, ...) "
            "and handler")
    return doc


def _web_changes(base: ModelSpec, spec: ModelSpec) -> list[str]:
    """What of the model, as the web reads it, ``spec`` changes from ``base``."""
    changed = [f.name for f in fields(ModelSpec)
               if f.name not in WORKER_FIELDS and getattr(base, f.name) != getattr(spec, f.name)]
    views = (("its input limits (options)", input_limits),
             ("its tensors (options)", lambda s: kind_of(s).tensors(s)),
             ("its tokenizer (options)",
              lambda s: TokenizerConfig.of(s) if s.measure == "tokens" else None))
    return changed + [what for what, view in views if view(base) != view(spec)]


def _wait_loaded(state: WebState, generations: dict[str, int]) -> dict[str, tuple[str, str]]:
    """Each entry's outcome once none is loading (load_outcome), when a live worker
    serves one at least and none was refused; else raise why not."""
    wait_s = max(state.settings.max_wait_s, MIN_INFER_WAIT_S)
    deadline = time.monotonic() + wait_s
    while True:
        live = state.models.registry.live()
        outcomes = {m: load_outcome(m, g, live) for m, g in generations.items()}
        loading = [m for m, (found, _) in outcomes.items() if found == LOADING]
        if not loading:
            break
        if time.monotonic() >= deadline:
            raise LoadTimeout(f"model {loading[0]!r} is still loading after {wait_s:g} s; the "
                              "load goes on (POST /v2/repository/index shows its state)")
        time.sleep(LOAD_POLL_S)  # a greenlet's pause under gunicorn's gevent workers
    refused = [(m, why) for m, (found, why) in outcomes.items() if found == REFUSED]
    if refused:
        raise LoadFailed(f"failed to load {refused[0][0]!r}: {refused[0][1]}")
    if all(found == NO_WORKER for found, _ in outcomes.values()):
        model, (_, why) = next(iter(outcomes.items()))
        raise NoWorkerLoaded(f"failed to load {model!r}: {why}")
    return outcomes


@blueprint.errorhandler(CarpoolError)
def repository_error(exc: CarpoolError) -> tuple[Response, int, dict[str, str]]:
    """The protocol's ``{"error": "<message>"}``, as every /v2 route answers."""
    if isinstance(exc, LoadTimeout):
        current_state().metrics.count_refused_request(exc, request)
        return jsonify({"error": str(exc)}), 504, {}
    return carpool_error(exc)
