"""The OpenAPI 3.0 document of the HTTP API, built from the live catalogue.

``GET /openapi.json`` serves it; each model's input schema comes from
``web.openapi.schemas``. A schemathesis run against real gunicorn fuzzes every operation
from this document (tests/e2e/test_faults_input.py).
"""

from __future__ import annotations

from typing import Any

from carpool.core.jobs import JOB_ID_CHARS, JobStatus
from carpool.core.settings import Settings
from web.openapi.event_paths import CALLER_TIMEOUT, JOB_FIELDS, PREFER, event_paths
from web.openapi.openai_paths import v1_paths
from web.openapi.rollout_paths import rollout_paths
from web.openapi.schemas import component, input_schema, many_schema, submit_schema
from web.openapi.tenant_paths import JOB_USAGE, TIER_HEADER, tenant_paths

_ERROR = {"$ref": "#/components/schemas/Error"}


def _responses(ok: tuple[str, str, dict[str, Any]], *errors: str) -> dict[str, Any]:
    code, text, schema = ok
    out: dict[str, Any] = {code: {"description": text,
                                  "content": {"application/json": {"schema": schema}}}}
    for status in errors:
        out[status] = {"description": _ERROR_TEXT[status],
                       "content": {"application/json": {"schema": _ERROR}}}
    # gunicorn refuses an over-long request line itself, before the app sees it.
    out["414"] = {"description": _ERROR_TEXT["414"],
                  "content": {"text/html": {"schema": {"type": "string"}}}}
    return out


_ERROR_TEXT = {
    "400": "bad input, with a message that says what to fix",
    "401": "an API key is needed, or this one is unknown",
    "403": "this API key is not an admin key, which this call needs",
    "404": "unknown model, or unknown, malformed or expired job id",
    "405": "method not allowed",
    "408": "the request body did not arrive in time (CARPOOL_BODY_TIMEOUT_S), or the "
           "client stopped sending it before its end",
    "409": "the job is running and can no longer be cancelled",
    "413": "body, input or batch over its limit",
    "414": "request line over gunicorn's limit (4094 bytes; answered by gunicorn, in HTML)",
    "415": "a content type this route does not take",
    "422": "idempotency key reused with a different input",
    "429": "the bin is full (for the request's service tier), the job would start too "
           "late, this API key is over its share of a nearly full bin, the model's byte "
           "budget is spent, the key's quota is spent (code bin_full, wait_too_long, "
           "over_share, budget_full, quota_exceeded), or this client holds too many "
           "long-polls (too_many_polls); see Retry-After",
    "503": "Redis is unreachable, loading or full (see Retry-After; during a submit the body "
           "carries the id the job may have been admitted under); or, at submit, every live "
           "worker refused the model (code model_unavailable, with the reason); or, at "
           "submit, the web itself is overloaded and answered before reading the request "
           "(code overloaded, Retry-After: 1)",
}

_JOB_ID = {"name": "job_id", "in": "path", "required": True,
           "schema": {"type": "string", "description": f"{JOB_ID_CHARS} characters"}}


def _components(settings: Settings) -> dict[str, Any]:
    accepted = {"type": "object", "required": ["id", "status", "model", "bin", "result_url"],
                "properties": {"id": {"type": "string"}, "status": {"type": "string"},
                               "model": {"type": "string"}, "bin": {"type": "string"},
                               "model_version": {"type": "string"},
                               "result_url": {"type": "string"},
                               "duplicate": {"type": "boolean"}}}
    error = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                       "type": {"type": "string"}, "param": {"type": "string", "nullable": True}}}}}
    job = {"type": "object", "required": ["id", "model", "status"], "properties": {
        "id": {"type": "string"}, "model": {"type": "string"},
        "model_version": {"type": "string"},
        "status": {"type": "string", "enum": [s.value for s in JobStatus]},
        "result": {}, "error": {"type": "string"},
        "error_code": {"type": "string", "enum": ["model_unavailable"]},
        "waiting_for": {"type": "object", "required": ["state", "reason"], "properties": {
            "state": {"type": "string", "enum": ["loading", "refused", "no worker"]},
            "reason": {"type": "string"}}},
        "timings_ms": {"type": "object", "additionalProperties": {"type": "number"}},
        "batch": {"type": "object", "properties": {  # the batch that ran it
            "id": {"type": "string"}, "size": {"type": "integer"}, "bin": {"type": "string"},
            "worker": {"type": "string"}, "model_version": {"type": "string"}}}, **JOB_FIELDS,
        "usage": JOB_USAGE}}
    schemas: dict[str, Any] = {"Accepted": accepted, "Error": error, "Job": job}
    for spec in settings.catalogue:
        schemas[f"Input_{component(spec)}"] = input_schema(spec)
        schemas[f"Submit_{component(spec)}"] = submit_schema(spec)
        schemas[f"Batch_{component(spec)}"] = many_schema(spec)
    out: dict[str, Any] = {"schemas": schemas}
    if settings.api_key_digests:
        out["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return out


def _wait(settings: Settings) -> dict[str, Any]:
    return {"name": "wait", "in": "query", "required": False,
            "schema": {"type": "number", "minimum": 0, "maximum": settings.max_wait_s}}


def _submit(settings: Settings) -> dict[str, Any]:
    names = [component(spec) for spec in settings.catalogue]
    json_body = {"oneOf": [{"$ref": f"#/components/schemas/Submit_{n}"} for n in names]}
    form = {"type": "object", "required": ["model", "file"], "properties": {
        "model": {"type": "string"}, "file": {"type": "string", "format": "binary"},
        "deadline_ms": {"type": "string"}, "priority": {"type": "string"},
        "idempotency_key": {"type": "string"}, "webhook": {"type": "string"},
        "webhook_events": {"type": "string", "description": "comma-separated"}}}
    return {"post": {
        "summary": "Queue one job; ?wait=S answers 200 with its result if it ends within S",
        "parameters": [
            _wait(settings), PREFER, CALLER_TIMEOUT, TIER_HEADER,
            {"name": "Idempotency-Key", "in": "header", "required": False,
             "schema": {"type": "string", "minLength": 1, "maxLength": 256}},
            {"name": "model", "in": "query", "required": False,
             "schema": {"type": "string"}, "description": "with a raw image/* body"}],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": json_body},
            "multipart/form-data": {"schema": form},
            "image/png": {"schema": {"type": "string", "format": "binary"}}}},
        "responses": {**_responses(("202", "queued", {"$ref": "#/components/schemas/Accepted"}),
                                   "400", "401", "404", "408", "413", "415", "422", "429",
                                   "503"),
                      "200": {"description": "with ?wait: the job ended within the wait",
                              "content": {"application/json": {
                                  "schema": {"$ref": "#/components/schemas/Job"}}}}},
    }}


def _many(settings: Settings) -> dict[str, Any]:
    names = [component(spec) for spec in settings.catalogue]
    item = {"oneOf": [{"$ref": "#/components/schemas/Accepted"},
                      {"$ref": "#/components/schemas/Job"}, {
        "type": "object", "required": ["error", "status"],
        "properties": {"error": {"type": "object"}, "status": {"type": "integer"},
                       "retry_after_s": {"type": "integer"}}}]}
    jobs = {"type": "object", "required": ["jobs"],
            "properties": {"jobs": {"type": "array", "items": item}}}
    return {"post": {
        "summary": "Queue many jobs for one model; each input fails alone; ?wait=S answers "
                   "200 when every job ended within S",
        "parameters": [_wait(settings), PREFER, CALLER_TIMEOUT, TIER_HEADER],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "oneOf": [{"$ref": f"#/components/schemas/Batch_{n}"} for n in names]}}}},
        "responses": {**_responses(("202", "one entry per input, in order", jobs),
                                   "400", "401", "404", "408", "413", "415", "503"),
                      "200": {"description": "with ?wait: every admitted job ended",
                              "content": {"application/json": {"schema": jobs}}}},
    }}


def _result(settings: Settings) -> dict[str, Any]:
    wait = _wait(settings)
    deleted = {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "string"}, "status": {"type": "string"}, "deleted": {"type": "boolean"}}}
    return {
        "parameters": [_JOB_ID],
        "get": {"summary": "A job's status and result; ?wait=S long-polls",
                "parameters": [wait, PREFER],
                "responses": _responses(("200", "the job", {"$ref": "#/components/schemas/Job"}),
                                        "400", "401", "404", "429", "503")},
        "delete": {"summary": "Cancel a queued job, or delete a finished one",
                   "responses": _responses(("200", "cancelled or deleted", deleted),
                                           "401", "404", "409", "503")},
    }


def _metrics() -> dict[str, Any]:
    op = _plain("Prometheus text format; needs 'Authorization: Bearer <token>' when "
                "CARPOOL_METRICS_TOKEN is set", "401")
    op["get"]["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
    return op


def _plain(summary: str, *errors: str) -> dict[str, Any]:
    return {"get": {"summary": summary,
                    "responses": _responses(("200", "ok", {"type": "object"}), *errors)}}


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The whole document for this process's settings and catalogue."""
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "carpool", "version": "1",
                 "description": "Batched asynchronous model inference: submit a job, "
                                "fetch its result by id."},
        "paths": {
            "/submit": _submit(settings),
            "/submit/batch": _many(settings),
            "/result/{job_id}": _result(settings),
            **event_paths(_responses, _JOB_ID),
            **tenant_paths(_responses),
            **rollout_paths(_responses),
            "/healthz": _plain("Liveness"),
            "/readyz": _plain("Readiness: Redis answers", "503"),
            "/metrics": _metrics(),
            "/openapi.json": _plain("This document"),
            **v1_paths(),
        },
        "components": _components(settings),
    }
    if settings.api_key_digests:
        for path in ("/submit", "/submit/batch", "/result/{job_id}", "/result/{job_id}/events",
                     "/events", "/usage", "/models/{name}/rollout",
                     *(p for p in doc["paths"] if p.startswith("/v1/"))):
            for op in doc["paths"][path].values():
                if isinstance(op, dict) and "responses" in op:
                    op["security"] = [{"bearer": []}]
    return doc
