"""The OpenAPI document's tenancy parts: ``GET /models`` (with each model's refusals by
service tier), ``GET /usage``, the ``X-Service-Tier`` header and the ``usage`` of a job
document (docs/admission.md, "Usage", "Quotas", "Service tiers")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from carpool.admission.tiers import AUTO, SERVICE_TIER_HEADER, TIERS
from carpool.backend.usage import USAGE_KEEP_HOURS
from web.openapi.rollout_paths import ROLLOUT

#: A lower tier asked for by header (a body's ``service_tier`` wins over it).
TIER_HEADER = {"name": SERVICE_TIER_HEADER, "in": "header", "required": False,
               "schema": {"type": "string", "enum": [*TIERS, AUTO]},
               "description": "run in a lower tier than the key's (a higher one: 400); "
                              "a body's service_tier wins"}

#: A job document's ``usage``, once a worker ended it.
JOB_USAGE = {"type": "object", "required": ["device_ms", "queue_ms"], "properties": {
    "device_ms": {"type": "number", "minimum": 0,
                  "description": "its share of its batch's forward time"},
    "queue_ms": {"type": "number", "minimum": 0, "description": "admission to claim"}}}

_COUNT = {"type": "integer", "minimum": 0}
_REFUSED_BY_TIER = {
    "type": "object", "required": list(TIERS),
    "properties": {tier: _COUNT for tier in TIERS},
    "description": "jobs admission refused (any 429 of admit.lua: bin_full, wait_too_long, "
                   "over_share, budget_full, quota_exceeded) by the service tier the request "
                   "ran in, since the counts began (never reset)"}
_BIN = {"type": "object",
        "required": ["name", "max_size", "max_batch", "max_wait_ms", "max_depth", "depth"],
        "properties": {"name": {"type": "string"}, "max_size": _COUNT, "max_batch": _COUNT,
                       "max_wait_ms": {"type": "number"}, "max_depth": _COUNT,
                       "depth": _COUNT}}
_WORKERS = {"type": "object", "required": ["state", "served_by", "loading_by", "refused"],
            "properties": {
                "state": {"type": "string",
                          "enum": ["served", "loading", "refused", "no worker"]},
                "served_by": _COUNT, "loading_by": _COUNT,
                "refused": {"type": "array", "items": {
                    "type": "object", "required": ["worker", "reason"],
                    "properties": {"worker": {"type": "string"},
                                   "reason": {"type": "string"}}}}}}
#: One model of ``GET /models``.
MODEL = {"type": "object",
         "required": ["name", "kind", "measure", "limits", "scheduling", "bins", "workers",
                      "refused_by_tier"],
         "properties": {
             "name": {"type": "string"}, "kind": {"type": "string"},
             "measure": {"type": "string"}, "limits": {"type": "object"},
             "scheduling": {"type": "object"},
             "bins": {"type": "array", "items": _BIN}, "workers": _WORKERS,
             "refused_by_tier": _REFUSED_BY_TIER,
             "rollout": {**ROLLOUT, "description": "a model's own entry's, when it has one"}}}

_USAGE_SUMS = {"jobs": _COUNT, "device_ms": {"type": "number", "minimum": 0},
               "queue_ms": _COUNT, "refused": _COUNT}
#: The answer of ``GET /usage``.
USAGE = {"type": "object", "required": ["from", "to", "keys", "total", "usage"], "properties": {
    "from": {"type": "string", "format": "date-time"},
    "to": {"type": "string", "format": "date-time", "description": "exclusive"},
    "keys": {"type": "string", "enum": ["own", "all"],
             "description": "all: an admin key's view of every key"},
    "total": {"type": "object", "required": list(_USAGE_SUMS), "properties": _USAGE_SUMS},
    "usage": {"type": "array", "items": {
        "type": "object", "required": ["key", "model", *_USAGE_SUMS],
        "properties": {"key": {"type": "string",
                               "description": "the first 12 hex digits of the key's SHA-256"},
                       "model": {"type": "string"}, **_USAGE_SUMS}}}}}

_WINDOW = [
    {"name": "hours", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": USAGE_KEEP_HOURS, "default": 24},
     "description": "the last N hours, this one included; not with from/to"},
    {"name": "from", "in": "query", "required": False,
     "schema": {"type": "string", "format": "date-time"},
     "description": "RFC 3339: the hour it falls in is the first (default: 23 hours "
                    f"before to), one of the last {USAGE_KEEP_HOURS} (usage is kept that "
                    "long), this one included"},
    {"name": "to", "in": "query", "required": False,
     "schema": {"type": "string", "format": "date-time"},
     "description": f"RFC 3339: the hour it falls in is the last (default: this one); a "
                    f"window spans {USAGE_KEEP_HOURS} hours at most"},
]


def tenant_paths(responses: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """``/models`` and ``/usage``; ``responses((status, text, schema), *error_statuses)``
    builds an operation's responses (document.py's)."""
    models = {"type": "object", "required": ["models"],
              "properties": {"models": {"type": "array", "items": MODEL}}}
    return {
        "/models": {"get": {
            "summary": "The catalogue with live queue depths, what the live workers say "
                       "about each model, and its refusals by service tier",
            "responses": responses(("200", "every model", models), "503")}},
        "/usage": {"get": {
            "summary": "What the caller's key (an admin key: every key) used per model over "
                       "whole hours: ?hours=N or ?from=&to=",
            "parameters": _WINDOW,
            "responses": responses(("200", "the window's sums per key and model", USAGE),
                                   "400", "401", "503")}},
    }
