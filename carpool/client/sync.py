"""The blocking client: ``Client(url, api_key=None)``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from carpool.client.errors import ApiError, ClientError
from carpool.client.handle import Job
from carpool.client.jobdoc import JobDoc, JobTimeout
from carpool.client.many_run import ManyRun
from carpool.client.protocol import (
    POLL_WAIT_S,
    Call,
    RetryPolicy,
    cancel_call,
    cancelled,
    decode,
    file_call,
    headers,
    require_event_stream,
    result_call,
    submit_call,
    unreachable,
)
from carpool.client.sse import READ_TIMEOUT_S, Event, Following, Reconnects, SseParser

#: How long ``load_model`` waits for its answer: the server answers within its own
#: wait (CARPOOL_MAX_WAIT_S, default 60 s), 504 if the model is still loading.
LOAD_TIMEOUT_S = 120.0


class Client:
    """carpool's HTTP API: submit, result, run (one round trip when it can) and map.

    ``options`` of submit/run/map are the submit fields: ``deadline_ms``,
    ``priority``, ``idempotency_key`` (submit and run only).
    """

    def __init__(self, url: str, api_key: str | None = None, *,
                 retry: RetryPolicy | None = None, transport: httpx.BaseTransport | None = None
                 ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._http = httpx.Client(base_url=self.url, headers=headers(api_key),
                                  transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call) -> Any:
        """The answer's JSON; 429/503/refused connections (and a GET's broken one)
        retried by the policy."""
        tries = 0
        while True:
            tries += 1
            try:
                return decode(self._http.request(**call.send_args()))
            except httpx.TransportError as exc:
                error: ClientError = unreachable(self.url, exc)
            except ClientError as exc:
                error = exc
            # A GET asked again does nothing twice: one broken mid-answer is retried too.
            delay = self.retry.delay_s(tries, error, safe_again=call.method == "GET")
            if delay is None:
                raise error
            time.sleep(delay)

    def ready(self, timeout_s: float = 2.0) -> bool:
        """Whether the server answers ``GET /readyz`` with 200 now (it reaches Redis);
        asked once, never retried."""
        try:
            return self._http.get("/readyz", timeout=timeout_s).status_code == 200
        except httpx.TransportError:
            return False

    def submit(self, model: str, job_input: Any, *, wait: float = 0.0,
               timeout_s: float | None = None, **options: Any) -> Job:
        """Queue one job; with ``wait`` > 0 the answer is its result if it ends by then.
        ``timeout_s``: how long the caller waits for it (X-Carpool-Timeout, its deadline:
        a job that cannot end in time is refused, or expires, never computed late)."""
        return Job.from_doc(self._send(submit_call(model, job_input, wait, options,
                                                   timeout_s)), self)

    def submit_file(self, model: str, data: bytes, content_type: str, *,
                    wait: float = 0.0) -> Job:
        """Queue one image sent as its raw bytes (``Content-Type: image/...``)."""
        return Job.from_doc(self._send(file_call(model, data, content_type, wait)), self)

    def result(self, job_id: str, wait: float = 0.0) -> Job:
        """The job as it is now, or once final if that comes within ``wait`` seconds."""
        return Job.from_doc(self._send(result_call(job_id, wait)), self)

    def wait(self, job: JobDoc, timeout_s: float) -> Job:
        """Long-poll ``job`` until final; raises ``JobTimeout`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        handle = job if isinstance(job, Job) else Job.from_doc(job.doc, self)
        while not handle.final:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JobTimeout(handle, timeout_s)
            handle = self.result(handle.id, wait=min(POLL_WAIT_S, remaining))
        return handle

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued job: True. False when it had already ended: ``DELETE
        /result`` then deletes its result. Raises ``RequestRejected`` (409) while it
        runs, (404) for an unknown job."""
        return cancelled(self._send(cancel_call(job_id)))

    def models(self) -> list[dict[str, Any]]:
        """``GET /models``: each model's bins with their depth, limits and workers."""
        return list((self._send(Call("GET", "/models")))["models"])

    def repository_index(self) -> list[dict[str, Any]]:
        """``POST /v2/repository/index``: each model's ``name``, ``version``, ``state``
        (READY, LOADING, UNLOADING, UNAVAILABLE) and ``reason``."""
        return list(self._send(Call("POST", "/v2/repository/index", json={})))

    def load_model(self, model: str, config: Mapping[str, Any] | None = None, *,
                   timeout_s: float = LOAD_TIMEOUT_S) -> dict[str, Any]:
        """Load (or reload) ``model`` (``m``: every version of it; ``m@v``: that one),
        with ``config``, a catalogue entry overriding the version's (Triton's
        ``parameters.config``); returns once a worker serves it."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        return dict(self._send(Call("POST", f"/v2/repository/models/{quote(model)}/load",
                                    json=body, timeout_s=timeout_s)))

    def unload_model(self, model: str) -> dict[str, Any]:
        """Unload ``model`` (``m``: every version of it; ``m@v``: that one): it takes no
        new jobs, its queued ones end failed, its claimed ones finish, then the workers
        free it."""
        return dict(self._send(Call("POST", f"/v2/repository/models/{quote(model)}/unload",
                                    json={})))

    def health(self, timeout_s: float = 2.0) -> dict[str, bool]:
        """``{"live", "ready"}``: the web answers ``/healthz``; it reaches Redis
        (``/readyz``). Asked once each, never retried."""
        out = {}
        for name, path in (("live", "/healthz"), ("ready", "/readyz")):
            try:
                out[name] = (self._http.get(path, timeout=timeout_s)).status_code == 200
            except httpx.TransportError:
                out[name] = False
        return out

    def events(self, job_ids: Sequence[str], last_event_id: str = "") -> Iterator[Event]:
        """Each event of the jobs' stream (``GET /result/<id>/events``, or ``GET /events``
        for several) until every one is final, reconnecting with ``Last-Event-ID`` when
        a stream ends before that (docs/events.md). An ``error`` event (Redis away) is
        yielded, then the stream reconnects; a refused or cut connection, 429 and 503
        are retried by the policy, as are streams that end at once without an event; a
        2xx that is not an event stream is ``bad_body``."""
        following = Following(list(job_ids), last_event_id)
        reconnects = Reconnects(self.retry, self.url)
        while not following.finished:
            parser = SseParser()
            told, opened_s = False, time.monotonic()
            error: ClientError | None = None
            try:
                with self._http.stream("GET", following.path(), headers=following.headers(),
                                       timeout=httpx.Timeout(READ_TIMEOUT_S)) as response:
                    if response.status_code == 204:
                        return  # every job final, and seen
                    if not response.is_success:
                        response.read()
                        decode(response)
                    require_event_stream(response)
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        if event is not None:
                            following.saw(event)
                            told = True
                            yield event
            except httpx.TransportError as exc:
                error = unreachable(self.url, exc)
            except ApiError as exc:  # 429 and 503 are retried; the rest raised
                error = exc
            if not following.finished:
                time.sleep(reconnects.delay_s(
                    told, time.monotonic() - opened_s, parser.retry_ms, error))

    def run(self, model: str, job_input: Any, *, timeout_s: float = 60.0,
            **options: Any) -> Any:
        """Submit, wait, return the result: one round trip when the job ends in time.
        Raises ``JobFailed`` when it fails or expires, ``JobTimeout`` after ``timeout_s``."""
        start = time.monotonic()
        job = self.submit(model, job_input, wait=min(POLL_WAIT_S, timeout_s),
                          timeout_s=timeout_s, **options)
        return self.wait(job, timeout_s - (time.monotonic() - start)).outcome()

    def map(self, model: str, inputs: Sequence[Any], *, timeout_s: float = 300.0,
            **options: Any) -> list[Any]:
        """Each input's result, in order, through /submit/batch (1000 inputs a request).
        Refused items (429/503) are retried by the policy; raises like ``run``."""
        start = time.monotonic()
        run = ManyRun(model, inputs, options)
        while True:
            wait_s = min(POLL_WAIT_S, max(0.0, timeout_s - (time.monotonic() - start)))
            left_s = timeout_s - (time.monotonic() - start)
            for chunk, call in run.calls(wait_s, left_s):
                run.take(chunk, self._send(call))
            delay = run.retry_delay_s(self.retry)
            if delay is None:
                break
            time.sleep(delay)
        for i, job in run.pending():
            run.jobs[i] = self.wait(job, timeout_s - (time.monotonic() - start))
        return run.results()
