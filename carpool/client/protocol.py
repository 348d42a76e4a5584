"""What the sync and asyncio clients share: the retry policy, and how a request is
built and its answer read. No I/O here."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from carpool.client.errors import (
    ApiError,
    ClientError,
    ConnectionBroken,
    Overloaded,
    RequestRejected,
    ServerUnreachable,
    Unavailable,
)

#: The longest ``?wait=`` one request asks for: under the server's default cap (60 s),
#: and short enough that a proxy's idle timeout does not cut the request.
POLL_WAIT_S = 30.0
#: A long-poll answers after its wait at the latest; this much more before the
#: client gives up on the connection.
TIMEOUT_MARGIN_S = 10.0
#: Inputs per /submit/batch request: the server refuses more (413).
MANY_INPUTS = 1000
#: The header that tells the server how long the caller waits for its result, in
#: seconds: the job's deadline (docs/admission.md), so nothing computes past it.
TIMEOUT_HEADER = "X-Carpool-Timeout"


@dataclass(frozen=True)
class RetryPolicy:
    """How 429, 503 and refused connections are retried: exponential backoff with
    jitter, never sooner than the server's ``Retry-After``."""

    #: Tries in all, the first included; 1 turns retries off.
    attempts: int = 4
    first_backoff_s: float = 0.25
    #: A Retry-After longer than this is not waited out: the error is raised.
    max_backoff_s: float = 30.0

    def delay_s(self, tries: int, exc: ClientError, *, safe_again: bool = False
                ) -> float | None:
        """Seconds to wait before the next try after ``tries`` failed; None: give up.
        ``safe_again``: a second request cannot do twice what the first did (a GET), so
        a connection broken mid-request is retried too."""
        retried = isinstance(exc, Overloaded | Unavailable | ServerUnreachable) or (
            safe_again and isinstance(exc, ConnectionBroken))
        if tries >= self.attempts or not retried:
            return None
        wanted = max(self.backoff_s(tries), getattr(exc, "retry_after_s", None) or 0.0)
        return wanted if wanted <= self.max_backoff_s else None

    def backoff_s(self, tries: int) -> float:
        """The backoff after ``tries`` failed: doubling, with jitter so that clients
        refused together do not come back together."""
        return float(self.first_backoff_s * 2 ** (tries - 1) * random.uniform(0.5, 1.0))


@dataclass(frozen=True)
class Call:
    """One HTTP request, ready for either client."""

    method: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    content_type: str | None = None
    timeout_s: float = POLL_WAIT_S
    headers: Mapping[str, str] = field(default_factory=dict)

    def send_args(self) -> dict[str, Any]:
        headers = dict(self.headers)
        if self.content_type:
            headers["Content-Type"] = self.content_type
        return {"method": self.method, "url": self.path, "params": dict(self.params),
                "json": self.json, "content": self.content, "headers": headers,
                "timeout": self.timeout_s}


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def wait_params(wait_s: float) -> dict[str, str]:
    return {"wait": f"{wait_s:g}"} if wait_s > 0 else {}


def waits_header(caller_timeout_s: float | None) -> dict[str, str]:
    """``X-Carpool-Timeout`` for a caller that waits ``caller_timeout_s`` (None: unsaid)."""
    if caller_timeout_s is None:
        return {}
    return {TIMEOUT_HEADER: f"{max(caller_timeout_s, 0.001):.3f}"}


def submit_call(model: str, job_input: Any, wait_s: float, options: Mapping[str, Any],
                caller_timeout_s: float | None = None) -> Call:
    body = {"model": model, "input": job_input, **{k: v for k, v in options.items()
                                                   if v is not None}}
    return Call("POST", "/submit", wait_params(wait_s), json=body,
                timeout_s=wait_s + TIMEOUT_MARGIN_S, headers=waits_header(caller_timeout_s))


def file_call(model: str, data: bytes, content_type: str, wait_s: float) -> Call:
    return Call("POST", "/submit", {"model": model, **wait_params(wait_s)}, content=data,
                content_type=content_type, timeout_s=wait_s + TIMEOUT_MARGIN_S)


def many_call(model: str, inputs: Sequence[Any], wait_s: float,
              options: Mapping[str, Any], caller_timeout_s: float | None = None) -> Call:
    body = {"model": model, "inputs": list(inputs),
            **{k: v for k, v in options.items() if v is not None}}
    return Call("POST", "/submit/batch", wait_params(wait_s), json=body,
                timeout_s=wait_s + TIMEOUT_MARGIN_S, headers=waits_header(caller_timeout_s))


def result_call(job_id: str, wait_s: float) -> Call:
    return Call("GET", f"/result/{job_id}", wait_params(wait_s),
                timeout_s=wait_s + TIMEOUT_MARGIN_S)


def cancel_call(job_id: str) -> Call:
    return Call("DELETE", f"/result/{job_id}")


def cancelled(answer: Any) -> bool:
    """``DELETE /result``'s answer: True when it cancelled a queued job, False when the
    job had ended (its result is then deleted)."""
    return isinstance(answer, dict) and answer.get("status") == "cancelled"


def error_for(status: int, code: str, message: str,
              retry_after: str | float | None) -> ApiError:
    """The typed error for an error answer (or a /submit/batch item's error)."""
    try:
        retry_after_s = float(retry_after) if retry_after is not None else None
    except ValueError:
        retry_after_s = None  # an HTTP date: rare, and a backoff still applies
    cls = (Overloaded if status == 429 else Unavailable if status == 503
           else RequestRejected if 400 <= status < 500 else ApiError)
    return cls(status, code, message, retry_after_s)


def decode(response: httpx.Response) -> Any:
    """The JSON body of a 2xx answer; raises the typed error of any other."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success:
        if body is None:
            raise ApiError(response.status_code, "bad_body", "the answer is not JSON")
        return body
    err = body.get("error", {}) if isinstance(body, dict) else {}
    if isinstance(err, str):  # the Open Inference Protocol's {"error": "<message>"} (/v2)
        err = {"message": err}
    message = err.get("message") or response.text[:200] or response.reason_phrase
    raise error_for(response.status_code, str(err.get("code", "http")), str(message),
                    response.headers.get("Retry-After"))


def require_event_stream(response: httpx.Response) -> None:
    """Raises ``bad_body`` unless a 2xx answer is ``text/event-stream``: a login page
    or a proxy's answer read as a stream has no event, and would be reconnected to
    forever."""
    media = response.headers.get("Content-Type", "").partition(";")[0].strip().lower()
    if media != "text/event-stream":
        raise ApiError(response.status_code, "bad_body", "the answer is not an event "
                       f"stream (Content-Type: {media or 'none'})")


def unreachable(url: str, exc: httpx.TransportError) -> ClientError:
    """What a transport failure means to the caller: a failed connect is safe to retry, a
    broken connection only where the request is (``RetryPolicy.delay_s``'s ``safe_again``)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ServerUnreachable(f"nothing answers at {url}: {exc}")
    return ConnectionBroken(f"the connection to {url} failed mid-request: {exc}")


def item_error(item: Mapping[str, Any]) -> ApiError:
    """The typed error of one refused /submit/batch item."""
    err = item.get("error", {})
    return error_for(int(item.get("status", 500)), str(err.get("code", "error")),
                     str(err.get("message", "")), item.get("retry_after_s"))
