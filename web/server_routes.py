"""The server's own routes, beside the API's surfaces: /models (the catalogue with live
depths), /metrics, /healthz, /readyz and /openapi.json."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST

from carpool.admission.urgency import MAX_PRIORITY, MIN_PRIORITY
from carpool.core.catalogue import ModelSpec
from carpool.intake import inputs
from web.common.refusals import Unauthorized
from web.common.state import current_state
from web.openapi.document import openapi_document

blueprint = Blueprint("carpool_server", __name__)


@blueprint.get("/models")
def models() -> Response:
    """The catalogue, with each bin's live depth (one pipelined round trip for all bins)
    and what the live workers say about each model (served, refused and why, none)."""
    state = current_state()
    specs = list(state.settings.catalogue)
    depths = iter(state.queue.depths([(s.name, b.name) for s in specs for b in s.bins]))
    return jsonify({"models": [{**_describe(spec, depths),
                                "workers": state.models.availability(spec.name).to_json()}
                               for spec in specs]})


@blueprint.get("/metrics")
def metrics() -> Response:
    """Prometheus text format: this process's view, or under gunicorn all processes' sum.

    Open unless ``CARPOOL_METRICS_TOKEN`` is set; API keys do not cover it (Prometheus
    scrapes with a token of its own).
    """
    token = current_state().settings.metrics_token
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
            raise Unauthorized("GET /metrics needs 'Authorization: Bearer <metrics token>' "
                               "(CARPOOL_METRICS_TOKEN)")
    return Response(current_state().metrics.render(), content_type=CONTENT_TYPE_LATEST)


@blueprint.get("/healthz")
def healthz() -> Response:
    """Liveness: the process answers. Redis is /readyz's business."""
    return jsonify({"status": "ok"})


@blueprint.get("/readyz")
def readyz() -> Response:
    current_state().queue.ping()  # BackendUnavailable answers 503
    return jsonify({"status": "ready"})


@blueprint.get("/openapi.json")
def openapi() -> Response:
    """The API's OpenAPI 3.0 document, with each model's input schema."""
    return jsonify(openapi_document(current_state().settings))


def _describe(spec: ModelSpec, depths: Iterator[int]) -> dict[str, Any]:
    bins = [
        {"name": b.name, "max_size": b.max_size, "max_batch": b.max_batch,
         "max_wait_ms": b.max_wait_ms, "max_depth": b.max_depth, "depth": next(depths)}
        for b in spec.bins
    ]
    scheduling = {"default_deadline_ms": spec.default_deadline_ms,
                  "max_deadline_ms": spec.max_deadline_ms,
                  "priorities": [MIN_PRIORITY, MAX_PRIORITY],
                  "priority_step_ms": spec.priority_step_ms, "p99_target_ms": spec.p99_target_ms}
    return {"name": spec.name, "kind": spec.kind, "measure": spec.measure,
            "limits": inputs.input_limits(spec), "scheduling": scheduling, "bins": bins}
