"""The JSON schema of each model's input, as ``carpool.intake.inputs`` enforces it.

Published in the OpenAPI document (``GET /openapi.json``) so clients and fuzzers
see the contract; ``carpool.intake.inputs`` stays the enforcement (it also measures and
bins), and a test keeps the two in agreement on examples of every kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from carpool.admission.tiers import AUTO, TIERS
from carpool.admission.urgency import MAX_PRIORITY, MIN_PRIORITY
from carpool.core.catalogue import ModelSpec
from carpool.core.kinds import kind_of
from carpool.core.versions import SEPARATOR
from carpool.core.webhooks import DEFAULT_EVENTS, EVENTS, MAX_URL_CHARS
from carpool.intake import inputs
from carpool.intake.images import ImageLimits

#: base64 of ``n`` bytes is at most this many characters (plus padding slack).
_B64_CHARS_PER_BYTE = 4 / 3
#: Keys a JSON Schema document may carry that an OpenAPI 3.0 schema object may not.
_JSON_SCHEMA_ONLY = frozenset({"$schema", "$id"})


def component(spec: ModelSpec) -> str:
    """``spec``'s part of its component names: OpenAPI's allow no '@' ("m@2" is "m.v2")."""
    return spec.name.replace(SEPARATOR, ".v")


def input_schema(spec: ModelSpec) -> dict[str, Any]:
    """The schema of one JSON ``input`` for ``spec`` (its kind's input form:
    carpool/core/kinds.py)."""
    return _SCHEMAS[kind_of(spec).input_form](spec)


def _custom_schema(spec: ModelSpec) -> dict[str, Any]:
    # The model's own (carpool.intake.custom enforces the same); OpenAPI 3.0 has no $schema/$id.
    # The catalogue refuses a python model without one.
    return {k: v for k, v in (spec.input_schema or {}).items() if k not in _JSON_SCHEMA_ONLY}


def _sized_schema(spec: ModelSpec) -> dict[str, Any]:
    return _object({"value": {"description": "any JSON value, echoed back"},
                    "size": {"type": "integer", "minimum": 0,
                             "maximum": spec.bins[-1].max_size}})


def _image_schema(spec: ModelSpec) -> dict[str, Any]:
    limits = ImageLimits.of(spec)
    return _object({"image_b64": {
        "type": "string", "format": "byte", "minLength": 1,
        "maxLength": int(spec.max_input_bytes * _B64_CHARS_PER_BYTE) + 4,
        "description": f"a JPEG, PNG or WebP file, base64; at most {limits.max_side} "
                       f"pixels a side and {limits.max_pixels} in all"}})


def _text_schema(spec: ModelSpec) -> dict[str, Any]:
    return _object({"text": {
        "type": "string", "minLength": 1, "maxLength": inputs.input_limits(spec)["max_chars"],
        "pattern": r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$",
        "description": "no control characters but tab and line breaks"}})


#: One schema per input form (carpool.core.kinds.INPUT_FORMS).
_SCHEMAS: dict[str, Callable[[ModelSpec], dict[str, Any]]] = {
    "sized": _sized_schema, "image": _image_schema, "text": _text_schema,
    "custom": _custom_schema,
}


def submit_schema(spec: ModelSpec) -> dict[str, Any]:
    """The body of ``POST /submit`` for ``spec``."""
    return _object({
        "model": {"type": "string", "enum": [spec.name]},
        "input": input_schema(spec),
        **_options_properties(spec),
        "idempotency_key": {"type": "string", "minLength": 1, "nullable": True,
                            "maxLength": inputs.MAX_IDEMPOTENCY_KEY_CHARS},
    }, required=("model", "input"))


def many_schema(spec: ModelSpec) -> dict[str, Any]:
    """The body of ``POST /submit/batch`` for ``spec``."""
    return _object({
        "model": {"type": "string", "enum": [spec.name]},
        # Items are any JSON on purpose: each is validated alone against the model's
        # input schema, and a bad one gets an error entry in the 202 answer.
        "inputs": {"type": "array", "minItems": 1, "maxItems": inputs.MAX_MANY_INPUTS,
                   "items": {"description": f"see Input_{component(spec)}"}},
        **_options_properties(spec),
    }, required=("model", "inputs"))


def _options_properties(spec: ModelSpec) -> dict[str, Any]:
    # null means "not given" (the default), as in carpool.intake.inputs; the model's own bounds
    # (carpool.admission.urgency): its max_deadline_ms, priorities 0..9.
    return {
        "deadline_ms": {"type": "integer", "minimum": 1, "maximum": spec.max_deadline_ms,
                        "nullable": True},
        "priority": {"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY,
                     "nullable": True},
        # Its address rules cannot be a schema: a valid-looking URL may still be a 400
        # (carpool.core.webhooks, docs/webhooks.md).
        "webhook": {"type": "string", "maxLength": MAX_URL_CHARS, "nullable": True,
                    "pattern": "^[hH][tT][tT][pP][sS]?://[!-~]+$",
                    "description": "an http(s) URL to POST the job's document to"},
        "service_tier": {"type": "string", "enum": [*TIERS, AUTO], "nullable": True,
                         "description": "the key's tier or a lower one"},
        "webhook_events": {"type": "array", "minItems": 1, "maxItems": len(EVENTS),
                           "nullable": True, "items": {"type": "string", "enum": list(EVENTS)},
                           "description": f"default: {list(DEFAULT_EVENTS)}"},
    }


def _object(properties: dict[str, Any], required: tuple[str, ...] | None = None,
            ) -> dict[str, Any]:
    return {"type": "object", "properties": properties,
            "required": list(required if required is not None else properties),
            "additionalProperties": False}
