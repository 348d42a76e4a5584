"""The client's side of event streams (carpool/client/sse.py) and its job handle, against
canned answers (httpx.MockTransport) and a real scripted server: parsing, reconnecting
with Last-Event-ID, 204, what is retried (429, 503, quick empty ends) and what is not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from carpool.cli import main
from carpool.client import (
    ApiError,
    AsyncClient,
    Client,
    ClientError,
    Detached,
    Job,
    RequestRejected,
    RetryPolicy,
    Unavailable,
)
from carpool.client.sse import QUICK_END_S, Reconnects, SseParser
from tests.support.scripted import Answer, Asked, json_error, scripted

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


#: Fast backoff for tests that reconnect against a real server; the bound unchanged.
FAST = RetryPolicy(first_backoff_s=0.001)
#: A server answering past this many requests is being reconnected to without a bound.
RUNAWAY = 8


def stream(body: str) -> Answer:
    return Answer(200, body.encode(), {"Content-Type": "text/event-stream"})


def test_a_2xx_that_is_not_an_event_stream_is_bad_body_at_once() -> None:
    def login_page(n: int, _asked: Asked) -> Answer:
        if n >= RUNAWAY:
            return json_error(404, "runaway")
        return Answer(200, b"<html>please log in</html>", {"Content-Type": "text/html"})

    with scripted(login_page) as server, Client(server.url, retry=FAST) as c:
        with pytest.raises(ApiError, match="not an event stream") as raised:
            list(c.events([JOB]))
        assert raised.value.code == "bad_body" and len(server.requests()) == 1

        async def follow() -> None:
            async with AsyncClient(server.url, retry=FAST) as ac:
                _ = [e async for e in ac.events([JOB])]

        with pytest.raises(ApiError, match="not an event stream"):
            asyncio.run(follow())
        assert len(server.requests()) == 2


def test_a_stream_that_keeps_ending_empty_is_given_up_after_the_policys_tries() -> None:
    def empty(n: int, _asked: Asked) -> Answer:
        return json_error(404, "runaway") if n >= RUNAWAY else stream(": nothing\n\n")

    with scripted(empty) as server, Client(server.url, retry=FAST) as c:
        with pytest.raises(ClientError, match="4 times in a row without an event") as raised:
            list(c.events([JOB]))
        assert not isinstance(raised.value, RequestRejected)
        assert len(server.requests()) == FAST.attempts


def redis_restart(retry_after_s: int) -> Callable[[int, Asked], Answer]:
    """The server's answers while Redis restarts: an error event ends the stream, the
    reconnects are refused (503, then 429), then the job's end."""
    answers = [stream(sse(("0", "queued")) + 'event: error\ndata: {"error": {"code": '
                      '"backend_unavailable"}}\n\n'),
               json_error(503, "backend_unavailable", retry_after_s),
               json_error(429, "overloaded", 0),
               stream(sse(("3", "done")))]
    return lambda n, _asked: answers[n] if n < len(answers) else json_error(404, "runaway")


def test_a_stream_reconnects_through_503_and_429_after_an_error_event() -> None:
    with scripted(redis_restart(0)) as server, Client(server.url, retry=FAST) as c:
        assert [e.event for e in c.events([JOB])] == ["queued", "error", "done"]
        assert [a.headers.get("last-event-id") for a in server.requests()] == [
            None, "0", "0", "0"]

    async def follow(url: str) -> list[str]:
        async with AsyncClient(url, retry=FAST) as ac:
            return [e.event async for e in ac.events([JOB])]

    with scripted(redis_restart(0)) as server:
        assert asyncio.run(follow(server.url)) == ["queued", "error", "done"]


def test_carpool_watch_sees_done_through_a_503_and_waits_out_its_retry_after(
        capsys: pytest.CaptureFixture[str]) -> None:
    with scripted(redis_restart(1)) as server:
        assert main(["watch", JOB, "--url", server.url]) == 0
        asked = server.requests()
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [
        "queued", "error", "done"]
    assert asked[2].at_s - asked[1].at_s >= 1.0  # the 503's Retry-After: 1


def test_reconnects_back_off_and_give_up_only_on_quick_empty_ends() -> None:
    r = Reconnects(RetryPolicy(), "http://x")
    assert r.delay_s(True, 0.1, None, None) == 0.25  # a minimum, even without `retry:`
    assert r.delay_s(True, 0.1, 1000, None) == 1.0
    assert r.delay_s(False, 0.1, None, None) >= 1.0  # `retry:` kept across connections
    for _ in range(10):  # a quiet job: each stream lasts its wait and tells nothing
        assert r.delay_s(False, 60.0, None, None) == 1.0
    quick = QUICK_END_S / 2
    r = Reconnects(RetryPolicy(), "http://x")
    delays = [r.delay_s(False, quick, 0, None) for _ in range(3)]
    assert delays[0] >= 0.25 and delays[2] > delays[0]
    with pytest.raises(ClientError, match="4 times"):
        r.delay_s(False, quick, 0, None)
    busy = Unavailable(503, "backend_unavailable", "m", retry_after_s=2.0)
    assert Reconnects(RetryPolicy(), "http://x").delay_s(False, quick, 0, busy) >= 2.0
    with pytest.raises(Unavailable):  # a Retry-After past the policy's longest backoff
        Reconnects(RetryPolicy(), "http://x").delay_s(
            False, quick, 0, Unavailable(503, "b", "m", retry_after_s=60.0))
