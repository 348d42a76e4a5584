"""The asyncio client: ``AsyncClient(url, api_key=None)``, the twin of ``Client``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

import httpx

from carpool.client.errors import ApiError, ClientError
from carpool.client.handle import AsyncJob
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


class AsyncClient:
    """carpool's HTTP API: submit, result, run (one round trip when it can) and map.

    ``options`` of submit/run/map are the submit fields: ``deadline_ms``,
    ``priority``, ``idempotency_key`` (submit and run only).
    """

    def __init__(self, url: str, api_key: str | None = None, *,
                 retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers(api_key),
                                  transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> Any:
        """The answer's JSON; 429/503/refused connections (and a GET's broken one)
        retried by the policy."""
        tries = 0
        while True:
            tries += 1
            try:
                return decode(await self._http.request(**call.send_args()))
            except httpx.TransportError as exc:
                error: ClientError = unreachable(self.url, exc)
            except ClientError as exc:
                error = exc
            # A GET asked again does nothing twice: one broken mid-answer is retried too.
            delay = self.retry.delay_s(tries, error, safe_again=call.method == "GET")
            if delay is None:
                raise error
            await asyncio.sleep(delay)

    async def submit(self, model: str, job_input: Any, *, wait: float = 0.0,
                     timeout_s: float | None = None, **options: Any) -> AsyncJob:
        """Queue one job; with ``wait`` > 0 the answer is its result if it ends by then.
        ``timeout_s``: how long the caller waits for it (X-Carpool-Timeout, its deadline:
        a job that cannot end in time is refused, or expires, never computed late)."""
        doc = await self._send(submit_call(model, job_input, wait, options, timeout_s))
        return AsyncJob.from_doc(doc, self)

    async def submit_file(self, model: str, data: bytes, content_type: str, *,
                    wait: float = 0.0) -> AsyncJob:
        """Queue one image sent as its raw bytes (``Content-Type: image/...``)."""
        return AsyncJob.from_doc(await self._send(file_call(model, data, content_type, wait)), self)

    async def result(self, job_id: str, wait: float = 0.0) -> AsyncJob:
        """The job as it is now, or once final if that comes within ``wait`` seconds."""
        return AsyncJob.from_doc(await self._send(result_call(job_id, wait)), self)

    async def wait(self, job: JobDoc, timeout_s: float) -> AsyncJob:
        """Long-poll ``job`` until final; raises ``JobTimeout`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        handle = job if isinstance(job, AsyncJob) else AsyncJob.from_doc(job.doc, self)
        while not handle.final:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JobTimeout(handle, timeout_s)
            handle = await self.result(handle.id, wait=min(POLL_WAIT_S, remaining))
        return handle

    async def cancel(self, job_id: str) -> bool:
        """Cancel a queued job: True. False when it had already ended: ``DELETE
        /result`` then deletes its result. Raises ``RequestRejected`` (409) while it
        runs, (404) for an unknown job."""
        return cancelled(await self._send(cancel_call(job_id)))

    async def models(self) -> list[dict[str, Any]]:
        """``GET /models``: each model's bins with their depth, limits and workers."""
        return list((await self._send(Call("GET", "/models")))["models"])

    async def health(self, timeout_s: float = 2.0) -> dict[str, bool]:
        """``{"live", "ready"}``: the web answers ``/healthz``; it reaches Redis
        (``/readyz``). Asked once each, never retried."""
        out = {}
        for name, path in (("live", "/healthz"), ("ready", "/readyz")):
            try:
                out[name] = (await self._http.get(path, timeout=timeout_s)).status_code == 200
            except httpx.TransportError:
                out[name] = False
        return out

    async def events(self, job_ids: Sequence[str], last_event_id: str = "") -> AsyncIterator[Event]:
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
                async with self._http.stream("GET", following.path(), headers=following.headers(),
                                       timeout=httpx.Timeout(READ_TIMEOUT_S)) as response:
                    if response.status_code == 204:
                        return  # every job final, and seen
                    if not response.is_success:
                        await response.aread()
                        decode(response)
                    require_event_stream(response)
                    async for line in response.aiter_lines():
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
                await asyncio.sleep(reconnects.delay_s(
                    told, time.monotonic() - opened_s, parser.retry_ms, error))

    async def run(self, model: str, job_input: Any, *, timeout_s: float = 60.0,
            **options: Any) -> Any:
        """Submit, wait, return the result: one round trip when the job ends in time.
        Raises ``JobFailed`` when it fails or expires, ``JobTimeout`` after ``timeout_s``."""
        start = time.monotonic()
        job = await self.submit(model, job_input, wait=min(POLL_WAIT_S, timeout_s),
                                timeout_s=timeout_s, **options)
        return (await self.wait(job, timeout_s - (time.monotonic() - start))).outcome()

    async def map(self, model: str, inputs: Sequence[Any], *, timeout_s: float = 300.0,
            **options: Any) -> list[Any]:
        """Each input's result, in order, through /submit/batch (1000 inputs a request).
        Refused items (429/503) are retried by the policy; raises like ``run``."""
        start = time.monotonic()
        run = ManyRun(model, inputs, options)
        while True:
            wait_s = min(POLL_WAIT_S, max(0.0, timeout_s - (time.monotonic() - start)))
            left_s = timeout_s - (time.monotonic() - start)
            for chunk, call in run.calls(wait_s, left_s):
                run.take(chunk, await self._send(call))
            delay = run.retry_delay_s(self.retry)
            if delay is None:
                break
            await asyncio.sleep(delay)
        pending = run.pending()
        left_s = timeout_s - (time.monotonic() - start)
        done = await asyncio.gather(*(self.wait(job, left_s) for _, job in pending))
        for (i, _), job in zip(pending, done, strict=True):
            run.jobs[i] = job
        return run.results()
