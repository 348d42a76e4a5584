"""The ``/v1`` operations in the OpenAPI document: OpenAI's shapes, loosely typed here
(their full schemas are OpenAI's; docs/batches.md), so that the fuzz run reaches them."""

from __future__ import annotations

from typing import Any

from carpool.admission.tiers import AUTO, TIERS
from carpool.intake.bulk_lines import ENDPOINTS
from web.openapi.tenant_paths import TIER_HEADER

_OBJECT = {"type": "object"}


def _error_statuses(*codes: str) -> dict[str, Any]:
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {code: {"description": "an error, with a message that says what to fix", **ref}
            for code in codes}


def _op(summary: str, *errors: str, body: dict[str, Any] | None = None,
        params: tuple[dict[str, Any], ...] = (), binary: bool = False) -> dict[str, Any]:
    content = ({"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
               if binary else {"application/json": {"schema": _OBJECT}})
    op: dict[str, Any] = {"summary": summary, "parameters": list(params), "responses": {
        "200": {"description": "ok", "content": content},
        "414": {"description": "request line over gunicorn's limit",
                "content": {"text/html": {"schema": {"type": "string"}}}},
        **_error_statuses("401", *errors)}}
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": body}}}
    return op


def _id(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


#: The tier asked for: the key's or a lower one (docs/admission.md, "Service tiers").
_TIER = {"type": "string", "enum": [*TIERS, AUTO], "nullable": True,
         "description": "the key's tier or a lower one"}
_PAGE = ({"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                      "maximum": 10000}},
         {"name": "after", "in": "query", "schema": {"type": "string"}})
_BATCH = {"type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
          "properties": {"input_file_id": {"type": "string"},
                         "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
                         "completion_window": {"type": "string", "example": "24h"},
                         "metadata": {"type": "object",
                                      "additionalProperties": {"type": "string"}},
                         "webhook": {"type": "string", "format": "uri"},
                         "service_tier": _TIER}}
_EMBED = {"type": "object", "required": ["model", "input"], "properties": {
    "model": {"type": "string"},
    "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "encoding_format": {"type": "string", "enum": ["float", "base64"]},
    "service_tier": _TIER}}


def _upload() -> dict[str, Any]:
    op = _op("Upload a batch input file (multipart: file, purpose=batch)", "400", "408",
             "413", "415", "503")
    op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "purpose"],
        "properties": {"file": {"type": "string", "format": "binary"},
                       "purpose": {"type": "string", "enum": ["batch"]}}}}}}
    return op


def v1_paths() -> dict[str, Any]:
    return {
        "/v1/files": {"get": _op("This key's files, newest first", "400", "503",
                                 params=_PAGE),
                      "post": _upload()},
        "/v1/files/{file_id}": {
            "get": _op("A file", "404", "503", params=(_id("file_id"),)),
            "delete": _op("Delete a file", "404", "503", params=(_id("file_id"),))},
        "/v1/files/{file_id}/content": {
            "get": _op("A file's bytes", "404", "503", params=(_id("file_id"),), binary=True)},
        "/v1/batches": {
            "get": _op("This key's batches, newest first", "400", "503", params=_PAGE),
            "post": _op("Create a batch (validating); its lines run in its service tier",
                        "400", "404", "408", "413", "503", body=_BATCH,
                        params=(TIER_HEADER,))},
        "/v1/batches/{batch_id}": {
            "get": _op("A batch", "404", "503", params=(_id("batch_id"),))},
        "/v1/batches/{batch_id}/cancel": {
            "post": _op("Cancel a batch", "404", "409", "503", params=(_id("batch_id"),))},
        "/v1/embeddings": {
            "post": _op("Embed strings with a text model (OpenAI's shape)", "400", "404",
                        "408", "413", "429", "500", "503", "504", body=_EMBED,
                        params=(TIER_HEADER,))},
    }
