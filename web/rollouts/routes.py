"""``PUT /models/<m>/rollout`` changes one thing of model m's rollout (a version and its
percent, a shadow and its percent, a version to retire: carpool/core/rollouts.py);
``DELETE`` rolls back at once. With API keys on, only an ``admin`` key may. Each answers
the model's rollout as ``GET /models`` shows it; this process sees it at once, the
others within ``ROLLOUT_REFRESH_S``."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import InvalidInput, UnknownModel
from carpool.core.rollouts import Rollout, change, rolled_back
from carpool.core.strict_json import parse_json
from carpool.core.versions import SEPARATOR, versions_of
from web.common.auth import request_owner
from web.common.refusals import BodyTooLarge, Forbidden
from web.common.state import WebState, current_state

blueprint = Blueprint("carpool_rollouts", __name__)

#: A change is a few fields: {"shadow": "2", "percent": 12.5}.
MAX_BODY_BYTES = 4096


@blueprint.put("/models/<name>/rollout")
def put_rollout(name: str) -> Response:
    state = current_state()
    _require_admin(state)
    spec = _own_entry(state, name)
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"a rollout change is a small JSON object (at most "
                           f"{MAX_BODY_BYTES} bytes)")
    if request.mimetype != "application/json":
        raise InvalidInput('send the change as application/json, e.g. {"version": "2", '
                           '"percent": 10}')
    body = parse_json(request.get_data())
    versions = versions_of(state.settings.catalogue.models, spec.name)
    state.routing.cache.store.update(
        spec.name, lambda current, now_ms: change(current, body, versions, spec.version,
                                                  now_ms))
    return _answer(state, spec)


@blueprint.delete("/models/<name>/rollout")
def delete_rollout(name: str) -> Response:
    """Every new job that names no version goes to the model's own entry, none is
    shadowed; retiring versions other than the entry's own stay retiring."""
    state = current_state()
    _require_admin(state)
    spec = _own_entry(state, name)
    state.routing.cache.store.update(spec.name, lambda current, _: rolled_back(current,
                                                                              spec.version))
    return _answer(state, spec)


def _answer(state: WebState, spec: ModelSpec) -> Response:
    state.routing.cache.forget()  # this process routes by the change from its next job
    shown: dict[str, Any] = state.routing.describe().get(spec.name) or {
        **Rollout().to_json(), "shadow_counts": {}, "retiring": []}
    return jsonify({"model": spec.name, "rollout": shown})


def _require_admin(state: WebState) -> None:
    owner = request_owner(state.settings, request)  # 401 without a key, or with an unknown one
    policy = state.settings.api_key_policies.get(owner)
    if owner and (policy is None or not policy.admin):
        raise Forbidden("only an admin API key (the keys file's 'admin') may change a "
                        "model's rollout")


def _own_entry(state: WebState, name: str) -> ModelSpec:
    if SEPARATOR in name:
        raise InvalidInput(f"name the model, not a version: /models/{name.split(SEPARATOR)[0]}"
                           "/rollout, with the version in the body")
    spec = state.settings.catalogue.models.get(name)
    if spec is None:
        known = ", ".join(sorted(s.name for s in state.settings.catalogue if not s.family))
        raise UnknownModel(f"unknown model {name[:64]!r}; known models: {known}")
    return spec
