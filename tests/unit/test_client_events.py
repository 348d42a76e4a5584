"""The client's side of event streams (carpool/client/sse.py) and its job handle, against
canned answers (httpx.MockTransport): parsing, reconnecting with Last-Event-ID, 204."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from carpool.client import AsyncClient, Client, Detached, Job, RequestRejected
from carpool.client.sse import SseParser

JOB = "j" * 26


def test_the_parser_reads_ids_events_data_retry_and_skips_comments() -> None:
    p = SseParser()
    lines = ["retry: 1500", "", ": keep-alive", "", "id: 0", "event: queued",
             'data: {"id": "j",', 'data: "status": "queued"}', "", "data: not json", ""]
    events = [e for e in map(p.feed, lines) if e is not None]
    assert p.retry_ms == 1500
    assert (events[0].id, events[0].event, dict(events[0].data)) == (
        "0", "queued", {"id": "j", "status": "queued"})
    assert events[1].event == "message" and events[1].data == {"raw": "not json"}


def sse(*events: tuple[str, str]) -> str:
    return "retry: 0\n\n" + "".join(
        f'id: {i}\nevent: {name}\ndata: {{"id": "{JOB}", "status": "{name}"}}\n\n'
        for i, name in events)


def test_events_reconnect_with_the_last_id_until_the_job_is_final() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Last-Event-ID"))
        body = sse(("0", "queued"), ("1", "running")) if len(seen) == 1 else sse(("3", "done"))
        return httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})

    with Client("http://x", transport=httpx.MockTransport(answer)) as c:
        job = Job.from_doc({"id": JOB, "status": "queued", "model": "m"}, c)
        assert [e.event for e in job.events()] == ["queued", "running", "done"]
    assert seen == [None, "1"]


def test_events_stop_at_204_and_raise_a_refusal() -> None:
    answers = iter([httpx.Response(204), httpx.Response(
        404, json={"error": {"code": "not_found", "message": "no job"}})])
    with Client("http://x", transport=httpx.MockTransport(lambda r: next(answers))) as c:
        assert list(c.events([JOB], last_event_id="3")) == []
        with pytest.raises(RequestRejected, match="404"):
            list(c.events([JOB]))


def test_the_async_client_follows_several_jobs_and_cancels() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(200, json={"id": JOB, "status": "cancelled"})
        assert request.url.path == "/events" and request.url.params["ids"] == f"{JOB},{JOB[:-1]}k"
        return httpx.Response(200, text=sse(("33", "done")) + sse(("33", "done")).replace(
            JOB, JOB[:-1] + "k"), headers={"Content-Type": "text/event-stream"})

    async def run() -> tuple[list[str], bool]:
        async with AsyncClient("http://x", transport=httpx.MockTransport(answer)) as c:
            names = [e.event async for e in c.events([JOB, JOB[:-1] + "k"])]
            return names, await c.cancel(JOB)

    names, cancelled = asyncio.run(run())
    assert names == ["done", "done"] and cancelled is True


def test_a_handle_without_a_client_says_so_and_a_final_one_is_not_cancelled() -> None:
    job = Job.from_doc({"id": JOB, "status": "done", "model": "m"})
    assert job.cancel() is False  # known final: nothing sent
    with pytest.raises(Detached):
        job.refresh()
