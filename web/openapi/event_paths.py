"""The OpenAPI entries of the event streams and of ``Prefer: wait`` (web/openapi/document.py
puts them in the document; docs/events.md describes them)."""

from __future__ import annotations

from typing import Any

from carpool.backend.outbox import DEAD, DELIVERED, PENDING, RETRYING
from carpool.core.jobs import JOB_ID_CHARS, JobStatus
from carpool.core.webhooks import EVENTS
from web.events.streams import MAX_STREAM_IDS

#: What a stream answers: text/event-stream, one schema per event.
_STREAM = {"text/event-stream": {"schema": {
    "type": "object", "required": ["id", "event", "data"], "properties": {
        "id": {"type": "string", "pattern": "^[0-9a-z]+$",
               "description": "one character per job followed: its state's version"},
        "event": {"type": "string", "enum": [*(s.value for s in JobStatus), "error"]},
        "data": {"type": "string", "description": "the job document, one JSON line"}},
    "description": "server-sent events (docs/events.md)"}}}
_LAST_EVENT_ID = {"name": "Last-Event-ID", "in": "header", "required": False,
                  "schema": {"type": "string", "pattern": "^[0-9a-z]*$"},
                  "description": "resume: the id of the last event received"}

#: The job document's fields that say when, how often, where and what next.
JOB_FIELDS: dict[str, Any] = {
    "created_at": {"type": "string", "format": "date-time"},
    "started_at": {"type": "string", "format": "date-time"},
    "completed_at": {"type": "string", "format": "date-time"},
    "attempts": {"type": "integer", "minimum": 0},
    "queue_position": {"type": "integer", "minimum": 0},
    "urls": {"type": "object", "required": ["result", "cancel", "events"], "properties": {
        "result": {"type": "string"}, "cancel": {"type": "string"},
        "events": {"type": "string"}}},
    # A job submitted with a webhook: its latest event's delivery (docs/webhooks.md).
    "webhook": {"type": "object", "required": ["state", "attempts", "last_status", "last_error"],
                "properties": {
                    "state": {"type": "string", "enum": [PENDING, RETRYING, DELIVERED, DEAD]},
                    "attempts": {"type": "integer", "minimum": 0},
                    "last_status": {"type": "integer", "nullable": True},
                    "last_error": {"type": "string", "nullable": True},
                    "event": {"type": "string", "enum": list(EVENTS)}}},
}

#: One job id, as a pattern.
_ID = f"[A-Za-z0-9_-]{{{JOB_ID_CHARS}}}"

PREFER = {"name": "Prefer", "in": "header", "required": False, "schema": {"type": "string"},
          "description": "RFC 7240 `wait=N` (whole seconds) instead of ?wait=; answered with "
                         "Preference-Applied"}
#: The caller's own timeout (web/common/sync_wait.py): its jobs' deadline.
CALLER_TIMEOUT = {"name": "X-Carpool-Timeout", "in": "header", "required": False,
                  "schema": {"type": "number", "minimum": 0, "exclusiveMinimum": True,
                             "maximum": 86400},
                  "description": "seconds the caller waits: its jobs' deadline (the sooner "
                                 "of it and deadline_ms), and the longest wait"}


def event_paths(responses: Any, job_id: dict[str, Any]) -> dict[str, Any]:
    """The two stream routes; ``responses`` builds the error answers (web/openapi/document.py)."""
    def stream(summary: str, parameters: list[dict[str, Any]], *errors: str) -> dict[str, Any]:
        answers = responses(("200", "the stream", {"type": "string"}), *errors)
        answers["200"]["content"] = _STREAM
        answers["204"] = {"description": "every job is final and the client saw it so"}
        return {"get": {"summary": summary, "parameters": parameters, "responses": answers}}

    ids = {"name": "ids", "in": "query", "required": True,
           "schema": {"type": "string", "pattern": f"^{_ID}(,{_ID}){{0,{MAX_STREAM_IDS - 1}}}$"},
           "description": f"comma-separated job ids, at most {MAX_STREAM_IDS}"}
    return {
        "/result/{job_id}/events": stream(
            "The job's state changes and its place while queued, as server-sent events",
            [job_id, _LAST_EVENT_ID], "400", "401", "404", "429", "503"),
        "/events": stream("Several jobs' events in one stream", [ids, _LAST_EVENT_ID],
                          "400", "401", "404", "429", "503"),
    }
