"""The OpenAPI document's rollout parts: ``PUT`` and ``DELETE /models/{name}/rollout``
and the ``rollout`` of a model in ``GET /models`` (docs/deployments.md, "Rollouts")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_VERSION = {"type": "string", "minLength": 1, "description": "one of the model's versions"}
_PERCENT = {"type": "number", "minimum": 0, "maximum": 100}
_COUNT = {"type": "integer", "minimum": 0}
_OPTIONAL_VERSION = {"type": "string", "nullable": True}

#: One change per request (carpool/core/rollouts.py ``change``).
CHANGE = {"oneOf": [
    {"type": "object", "required": ["version", "percent"], "additionalProperties": False,
     "properties": {"version": _VERSION, "percent": _PERCENT},
     "description": "jobs naming no version go to this one with this probability"},
    {"type": "object", "required": ["shadow", "percent"], "additionalProperties": False,
     "properties": {"shadow": _VERSION, "percent": _PERCENT},
     "description": "copy this share of the model's jobs to this version, unanswered"},
    {"type": "object", "required": ["retire"], "additionalProperties": False,
     "properties": {"retire": _VERSION},
     "description": "this version admits nothing new, drains, then is unloaded"}]}

#: A model's rollout, as ``GET /models`` and a change's answer show it.
ROLLOUT = {
    "type": "object",
    "required": ["version", "percent", "shadow", "shadow_percent", "shadow_counts",
                 "retiring"],
    "properties": {
        "version": _OPTIONAL_VERSION, "percent": _PERCENT, "shadow": _OPTIONAL_VERSION,
        "shadow_percent": _PERCENT,
        "shadow_counts": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["compared", "agreed"],
            "properties": {"compared": _COUNT, "agreed": _COUNT}}},
        "retiring": {"type": "array", "items": {
            "type": "object",
            "required": ["version", "retired_at_ms", "queued", "running", "state"],
            "properties": {"version": {"type": "string"}, "retired_at_ms": _COUNT,
                           "queued": _COUNT, "running": _COUNT,
                           "state": {"type": "string", "enum": ["draining", "retired"]}}}}}}

_ANSWER = {"type": "object", "required": ["model", "rollout"],
           "properties": {"model": {"type": "string"}, "rollout": ROLLOUT}}
_NAME = {"name": "name", "in": "path", "required": True,
         "schema": {"type": "string"}, "description": "a model's own entry (not m@v)"}
_ADMIN = "with API keys on, an admin key only (else 403)"


def rollout_paths(responses: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """``/models/{name}/rollout``; ``responses((status, text, schema), *error_statuses)``
    builds an operation's responses (document.py's)."""
    put = responses(("200", "the model's rollout after the change", _ANSWER),
                    "400", "401", "403", "404", "408", "409", "413", "415", "503")
    put["409"] = {**put["409"], "description": "the change contradicts the rollout: "
                  "retiring a version jobs still go to, or shadowing to a retiring one"}
    return {"/models/{name}/rollout": {
        "parameters": [_NAME],
        "put": {"summary": f"Change one thing of a model's rollout; {_ADMIN}",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": CHANGE}}},
                "responses": put},
        "delete": {"summary": f"Roll back: jobs naming no version go to the model's own "
                              f"entry, no shadow; {_ADMIN}",
                   "responses": responses(("200", "the model's rollout after it", _ANSWER),
                                          "400", "401", "403", "404", "503")}}}
