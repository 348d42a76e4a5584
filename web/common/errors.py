"""Errors as HTTP answers: every failure is JSON ``{"error": {"code", "message", ...}}``.

The error object is OpenAI's (``type`` and ``param`` too), so its SDKs read it whole.

Each carpool error class maps to one status and code in web/common/refusals.py's table,
so a route raises and never formats an error body itself. ``/submit/batch`` uses
the same table for its per-item errors.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from flask import Flask, Request, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from carpool.core.errors import (
    BackendUnavailable,
    BatchEnded,
    BinFull,
    BudgetFull,
    CarpoolError,
)
from web.common.refusals import JobFailed, refusal_of
from web.results.polls import TooManyPolls

log = logging.getLogger(__name__)

#: Retry-After for a 503: Redis restarts or fails over in seconds, not minutes.
UNAVAILABLE_RETRY_AFTER_S = 2
#: Retry-After for a client over its long-poll cap: one of its polls ends soon.
POLLS_RETRY_AFTER_S = 1


class AdmissionUnknown(BackendUnavailable):
    """Raised when Redis failed during an admission: the jobs may or may not be queued.

    The script may already sit in Redis's socket buffer and run once Redis resumes,
    so the answer carries the ids the jobs would have: GET /result/<id> tells. One
    submit's answer names its ``id``; a many-input call's (``/submit/batch``, ``/v2``
    infer) names the ``ids`` its failed call held.
    """

    def __init__(self, job_ids: Sequence[str], cause: BackendUnavailable,
                 many: bool = False) -> None:
        which, read = ((f"jobs {', '.join(job_ids)}", "GET /result/<id> of each") if many
                       else (f"job {job_ids[0]}", f"GET /result/{job_ids[0]}"))
        super().__init__(
            f"{cause}; {which} may have been admitted: {read} tells (404: it was not), "
            "and a retry with the same idempotency key never queues it twice")
        self.job_ids = tuple(job_ids)
        self.many = many


#: OpenAI's error types by status; any other 4xx is an ``invalid_request_error``.
_ERROR_TYPES = {401: "authentication_error", 403: "permission_error",
                429: "rate_limit_error"}
#: Codes for werkzeug's own errors whose class name reads badly as a code.
_HTTP_CODES = {413: "body_too_large", 415: "unsupported_media_type"}


def status_and_code(exc: CarpoolError) -> tuple[int, str]:
    """The HTTP status and error code that answer ``exc`` (web/common/refusals.py)."""
    row = refusal_of(exc)
    return row.status, row.code


def error_type(status: int) -> str:
    """OpenAI's ``error.type`` for an answer of ``status`` (its SDKs read it as
    ``e.type``): what kind of failure, where ``code`` says which."""
    if status >= 500:
        return "server_error"
    return _ERROR_TYPES.get(status, "invalid_request_error")


def error_body(code: str, message: str, exc: Exception | None = None,
               status: int = 400) -> dict[str, Any]:
    """The JSON error, shaped as OpenAI's (``param``: carpool names the field in the
    message); with the job's ``id`` when ``exc`` left its admission unknown."""
    body: dict[str, Any] = {"error": {"code": code, "message": message,
                                      "type": error_type(status), "param": None}}
    if isinstance(exc, AdmissionUnknown) and exc.many:
        body["ids"] = list(exc.job_ids)
    elif isinstance(exc, AdmissionUnknown):
        body["id"] = exc.job_ids[0]
    return body


def retry_after_s(exc: CarpoolError) -> int | None:
    """Whole seconds for a Retry-After header, or None when retrying will not help."""
    if isinstance(exc, BinFull | BudgetFull):
        return max(1, math.ceil(exc.retry_after_s))
    if isinstance(exc, BackendUnavailable):
        return UNAVAILABLE_RETRY_AFTER_S
    if isinstance(exc, TooManyPolls):
        return POLLS_RETRY_AFTER_S
    return None


def _carpool_error(exc: CarpoolError) -> tuple[Response, int]:
    status, code = status_and_code(exc)
    # A wait that ran out (504) and a job that failed in its model are answers, not
    # faults here: a line at most, no traceback for clients to flood the log with.
    if isinstance(exc, JobFailed):
        log.warning("request answered %d: %s", status, exc)
    elif status >= 500 and status not in (503, 504):
        log.exception("carpool error answered %d", status, exc_info=exc)
    response = jsonify(error_body(code, str(exc), exc, status))
    retry = retry_after_s(exc)
    if retry is not None:
        response.headers["Retry-After"] = str(retry)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="carpool"'
    if isinstance(exc, BatchEnded):
        # OpenAI's SDKs retry every 409 (a lock timeout, at OpenAI) unless told not to:
        # an ended batch stays ended, so the retries would only delay the error.
        response.headers["X-Should-Retry"] = "false"
    return response, status


def _http_error(exc: HTTPException) -> tuple[Response, int]:
    status = exc.code or 500
    code = _HTTP_CODES.get(status) or re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()
    message = exc.description or exc.name
    if status == 413:  # werkzeug's own text does not say what the limit is
        message = f"request body is over {current_app.config['MAX_CONTENT_LENGTH']} bytes"
    response = jsonify(error_body(code, message, status=status))
    for name, value in exc.get_headers():
        if name.lower() == "allow":  # 405 says which methods would work
            response.headers[name] = value
    return response, status


def _unexpected(exc: Exception) -> tuple[Response, int]:
    log.exception("unhandled error", exc_info=exc)
    return jsonify(error_body("internal_error", "internal error; see the server log",
                              status=500)), 500


def register(app: Flask, on_refused: Callable[[Exception, Request], None]) -> None:
    """Answer every error of ``app`` as JSON; tell ``on_refused`` of each carpool or
    HTTP error first (the one place a refused submission is counted)."""

    def handler(exc: Exception) -> tuple[Response, int]:
        return handled(exc, request, on_refused)

    app.register_error_handler(Exception, handler)


def handled(exc: Exception, req: Request,
            on_refused: Callable[[Exception, Request], None]) -> tuple[Response, int]:
    """The app's answer to an error of ``req`` (Flask's handler and the lean routes' own,
    web/common/lean.py): a refusal (a carpool or HTTP error) told to ``on_refused`` first."""
    if isinstance(exc, CarpoolError | HTTPException):
        on_refused(exc, req)
    return error_answer(exc)


def error_answer(exc: Exception) -> tuple[Response, int]:
    """The JSON answer and status of any error a route raised (the app's handlers' own,
    which the lean routes share: web/common/lean.py). Needs an app context."""
    if isinstance(exc, CarpoolError):
        return _carpool_error(exc)
    if isinstance(exc, HTTPException):
        return _http_error(exc)
    return _unexpected(exc)
