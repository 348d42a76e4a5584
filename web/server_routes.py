"""The server's own routes, beside the API's surfaces: /models (the catalogue with live
depths), /usage (what each key's jobs cost), /metrics, /healthz, /readyz and
/openapi.json."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST

from carpool.admission.urgency import MAX_PRIORITY, MIN_PRIORITY
from carpool.backend.usage import HOUR_MS, USAGE_KEEP_HOURS, current_hour, read_usage
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import InvalidInput
from carpool.core.jobs import rfc3339
from carpool.intake import inputs
from web.common.auth import request_owner
from web.common.refusals import Unauthorized
from web.common.state import current_state
from web.openapi.document import openapi_document

blueprint = Blueprint("carpool_server", __name__)
#: ``?hours=N`` of GET /usage: a whole number of a few ASCII digits.
_HOURS = re.compile(r"[0-9]{1,6}")


@blueprint.get("/models")
def models() -> Response:
    """The catalogue, with each bin's live depth and each model's jobs refused at
    admission by service tier (one pipelined round trip for all), what the live
    workers say about each model (served, refused and why, none), and on a model's
    own entry its rollout, when it has one (docs/deployments.md)."""
    state = current_state()
    specs = list(state.settings.catalogue)
    depths, refused = state.queue.depths_and_refused(
        [(s.name, b.name) for s in specs for b in s.bins], [s.name for s in specs])
    bin_depths = iter(depths)
    rollouts = state.routing.describe()
    return jsonify({"models": [{**_describe(spec, bin_depths),
                                "workers": state.models.availability(spec.name).to_json(),
                                "refused_by_tier": by_tier,
                                **({"rollout": rollouts[spec.name]}
                                   if spec.name in rollouts else {})}
                               for spec, by_tier in zip(specs, refused, strict=True)]})


@blueprint.get("/usage")
def usage() -> Response:
    """What the caller's jobs cost per model over a window of whole hours (an ``admin``
    key: every key's): jobs, device and queue time, refusals (docs/admission.md)."""
    state = current_state()
    owner = request_owner(state.settings, request)
    policy = state.settings.api_key_policies.get(owner)
    everyone = policy is not None and policy.admin
    first, last = _usage_window(current_hour())
    rows = read_usage(state.queue.client, state.queue.keys,
                      [s.name for s in state.settings.catalogue], first, last,
                      None if everyone else owner)
    total = {name: sum(r.to_json()[name] for r in rows)  # type: ignore[misc]
             for name in ("jobs", "device_ms", "queue_ms", "refused")}
    return jsonify({"from": rfc3339(first * HOUR_MS), "to": rfc3339((last + 1) * HOUR_MS),
                    "keys": "all" if everyone else "own", "total": total,
                    "usage": [r.to_json() for r in rows]})


def _usage_window(now_hour: int) -> tuple[int, int]:
    """The first and last hour asked for: ``hours=N`` (the last N, this one included;
    default 24), or ``from`` and ``to`` (RFC 3339; each names the hour it falls in)."""
    args = request.args
    if "hours" in args and ("from" in args or "to" in args):
        raise InvalidInput("give either hours=N or from=...&to=..., not both")
    if "from" in args or "to" in args:
        last = _hour_arg("to", now_hour)
        first = _hour_arg("from", last - 23)
    else:
        text = args.get("hours", "24")
        # ASCII digits, few of them: int() refuses "²" (a digit to isdigit) and 5,000 digits.
        if not _HOURS.fullmatch(text) or not 1 <= int(text) <= USAGE_KEEP_HOURS:
            raise InvalidInput(f"hours must be a whole number from 1 to {USAGE_KEEP_HOURS} "
                               f"(usage is kept that long), not {text[:20]!r}")
        first, last = now_hour - int(text) + 1, now_hour
    if first > last:
        raise InvalidInput("from must not be after to")
    if last - first >= USAGE_KEEP_HOURS:
        raise InvalidInput(f"a window spans {USAGE_KEEP_HOURS} hours at most "
                           "(usage is kept that long)")
    # Hours before the kept ones would read as zeros, not as forgotten; hours after this
    # one hold nothing yet (and the year 9999's last is past what RFC 3339 can write).
    oldest = now_hour - USAGE_KEEP_HOURS + 1
    if not oldest <= first <= now_hour:
        raise InvalidInput(
            "from (by default 23 hours before to) must fall in the hours usage is kept: "
            f"from {rfc3339(oldest * HOUR_MS)} to this one, {rfc3339(now_hour * HOUR_MS)}")
    return first, last


def _hour_arg(name: str, default: int) -> int:
    text = request.args.get(name)
    if text is None:
        return default
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{name} must be an RFC 3339 time such as 2026-01-31T09:00:00Z, "
                           f"not {text[:40]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp()) // 3600


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
    # "name" addresses it ("m@2" for a declared version); "model" and "version" say whose.
    return {"name": spec.name, "model": spec.base_name, "version": spec.version,
            "kind": spec.kind, "measure": spec.measure,
            "limits": inputs.input_limits(spec), "scheduling": scheduling, "bins": bins}
