"""The client's errors: each failure it reports is a ``ClientError``; an error status
from the server is an ``ApiError`` of its kind."""

from __future__ import annotations

from carpool.core.errors import CarpoolError


class ClientError(CarpoolError):
    """Raised for any failure that carpool's client reports."""


class ServerUnreachable(ClientError):
    """Raised when nothing answers at the server's URL (refused, unknown host, timeout)."""


class ConnectionBroken(ClientError):
    """Raised when a connection failed after the request may have reached the server
    (reset, cut mid-answer, a read that timed out): retried only where a second request
    is safe (an event stream, a download), never for a submit (the job may be queued)."""


class ApiError(ClientError):
    """Raised when the server answers with an error status."""

    def __init__(self, status: int, code: str, message: str,
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


class Overloaded(ApiError):
    """Raised on 429: the bin is full or the job would wait too long; see retry_after_s."""


class Unavailable(ApiError):
    """Raised on 503: the server cannot reach Redis, or no worker will serve the model."""


class RequestRejected(ApiError):
    """Raised on another 4xx: the request itself is wrong (input, model, key)."""
