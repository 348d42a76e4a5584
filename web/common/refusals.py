"""Refusals: one table from each error a request may end in to its HTTP status, its
error code, and the ``reason`` label of ``carpool_jobs_rejected_total``.

``web/common/errors.py`` answers with the status and code, ``web/common/metrics.py`` counts the
reason; both read ``REFUSALS``, so a new refusal is one row. The web's own error
classes are defined here, beside their rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from carpool.core.errors import (
    BackendUnavailable,
    BinFull,
    BudgetFull,
    CarpoolError,
    IdempotencyConflict,
    InputOverLimit,
    InputTooLarge,
    InvalidInput,
    InvalidJson,
    ModelRefused,
    NotCancellable,
    OverShare,
    QuotaExceeded,
    TooManyInputs,
    TooManyJsonValues,
    UnknownModel,
    UnsupportedMediaType,
    WaitTooLong,
)
from carpool.core.rollouts import RolloutConflict
from web.results.polls import TooManyPolls


class BodyTooLarge(InputTooLarge):
    """Raised when a request body is over the limit of what it may carry (web/common/bodies.py)."""


class BodyTimeout(CarpoolError):
    """Raised when a request body does not arrive within its time limit (web/common/bodies.py)."""


class MalformedBody(InvalidInput):
    """Raised when a request body breaks its framing: a bad chunk size, a chunk without
    its CRLF, a malformed trailer (web/common/bodies.py)."""


class BodyCutShort(CarpoolError):
    """Raised when the client stops sending a request body before its end (web/common/bodies.py)."""


class JobNotFound(CarpoolError):
    """Raised when a job id is malformed, unknown, or its record has expired."""


class ResourceNotFound(CarpoolError):
    """Raised when a file or batch id names none of this API key's (or none at all)."""


class ResultsLate(CarpoolError):
    """Raised when a synchronous request's jobs did not end within the wait allowed."""


class JobFailed(CarpoolError):
    """Raised when a synchronous request's job ended failed, expired or cancelled."""


class CallerGone(CarpoolError):
    """Raised when a synchronous request's client closed its connection while it waited:
    its jobs still queued were cancelled (web/common/sync_wait.py); nobody reads the 499."""


class Unauthorized(CarpoolError):
    """Raised when the server has API keys and a request brings none or an unknown one."""


class Forbidden(CarpoolError):
    """Raised when a known API key asks for what only an ``admin`` key may do."""


@dataclass(frozen=True)
class Refusal:
    """How one error class answers: HTTP ``status``, error ``code``, metric ``reason``."""

    error: type[CarpoolError]
    status: int
    code: str
    #: The job-rejection reason; "error" where it is none of the job's doing to name.
    reason: str


#: First match wins, so a subclass comes before its base.
REFUSALS: tuple[Refusal, ...] = (
    Refusal(UnsupportedMediaType, 415, "unsupported_media_type", "invalid"),
    Refusal(InvalidJson, 400, "invalid_json", "invalid"),
    Refusal(TooManyInputs, 413, "too_many_inputs", "too_large"),
    Refusal(BodyTooLarge, 413, "body_too_large", "too_large"),
    Refusal(TooManyJsonValues, 413, "too_many_json_values", "too_large"),
    Refusal(BodyTimeout, 408, "body_timeout", "invalid"),
    Refusal(BodyCutShort, 408, "body_incomplete", "invalid"),
    Refusal(MalformedBody, 400, "malformed_body", "invalid"),
    Refusal(TooManyPolls, 429, "too_many_polls", "error"),
    Refusal(InputTooLarge, 413, "input_too_large", "too_large"),
    Refusal(InputOverLimit, 400, "input_over_limit", "invalid"),
    Refusal(InvalidInput, 400, "invalid_input", "invalid"),
    Refusal(UnknownModel, 404, "unknown_model", "unknown_model"),
    Refusal(JobNotFound, 404, "not_found", "error"),
    Refusal(ResourceNotFound, 404, "not_found", "error"),
    Refusal(ResultsLate, 504, "results_late", "error"),
    Refusal(JobFailed, 500, "job_failed", "error"),
    Refusal(CallerGone, 499, "client_gone", "error"),
    Refusal(Unauthorized, 401, "unauthorized", "error"),
    Refusal(Forbidden, 403, "forbidden", "error"),
    Refusal(RolloutConflict, 409, "rollout_conflict", "error"),
    Refusal(IdempotencyConflict, 422, "idempotency_conflict", "conflict"),
    Refusal(NotCancellable, 409, "not_cancellable", "error"),
    Refusal(WaitTooLong, 429, "wait_too_long", "wait_too_long"),
    Refusal(OverShare, 429, "over_share", "over_share"),
    Refusal(QuotaExceeded, 429, "quota_exceeded", "quota_exceeded"),
    Refusal(BinFull, 429, "bin_full", "bin_full"),
    Refusal(BudgetFull, 429, "budget_full", "budget_full"),
    Refusal(ModelRefused, 503, "model_unavailable", "error"),
    Refusal(BackendUnavailable, 503, "backend_unavailable", "unavailable"),
)
#: Any other carpool error (ConfigError and the like): the server's fault.
INTERNAL = Refusal(CarpoolError, 500, "internal_error", "error")
#: werkzeug's own errors (not carpool's): a body over MAX_CONTENT_LENGTH, a malformed
#: multipart body; web/common/errors.py answers them with their own status.
HTTP_TOO_LARGE_REASON, HTTP_OTHER_REASON = "too_large", "invalid"
#: Every value the ``reason`` label takes.
REASONS: tuple[str, ...] = tuple(dict.fromkeys(
    [*(r.reason for r in REFUSALS), INTERNAL.reason, HTTP_TOO_LARGE_REASON, HTTP_OTHER_REASON]))


def refusal_of(exc: CarpoolError) -> Refusal:
    """The row that answers ``exc``."""
    for row in REFUSALS:
        if isinstance(exc, row.error):
            return row
    return INTERNAL
