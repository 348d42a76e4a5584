"""carpool.client's own logic (errors, retries, map's bookkeeping) against scripted
answers from httpx's MockTransport; the real stack is tests/e2e/test_e2e_one_round_trip.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from carpool.client import (
    AsyncClient,
    Client,
    JobFailed,
    Overloaded,
    RequestRejected,
    RetryPolicy,
    ServerUnreachable,
    Unavailable,
)

Handler = Callable[[httpx.Request], httpx.Response]


def error(status: int, code: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after else {}
    return httpx.Response(status, json={"error": {"code": code, "message": "m"}},
                          headers=headers)


def done(job_id: str, result: Any) -> httpx.Response:
    return httpx.Response(200, json={"id": job_id, "model": "m", "status": "done",
                                     "result": result})


def scripted(answers: list[httpx.Response], seen: list[httpx.Request]) -> Handler:
    it: Iterator[httpx.Response] = iter(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return next(it)

    return handle


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("carpool.client.sync.time.sleep", slept.append)
    return slept


def client(answers: list[httpx.Response], seen: list[httpx.Request],
           retry: RetryPolicy | None = None, api_key: str | None = None) -> Client:
    return Client("http://carpool.test", api_key=api_key, retry=retry,
                  transport=httpx.MockTransport(scripted(answers, seen)))


def test_a_429_is_retried_no_sooner_than_its_retry_after(sleeps: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = client([error(429, "wait_too_long", "3"), done("j1", 42)], seen)
    assert c.run("m", {"x": 1}) == 42
    assert len(seen) == 2 and sleeps and sleeps[0] >= 3


def test_retries_give_up_with_the_typed_error(sleeps: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = client([error(503, "backend_unavailable", "1")] * 3, seen, RetryPolicy(attempts=3))
    with pytest.raises(Unavailable) as info:
        c.submit("m", {})
    assert len(seen) == 3 and len(sleeps) == 2 and info.value.retry_after_s == 1


def test_a_retry_after_longer_than_the_policy_allows_is_raised_at_once(
        sleeps: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = client([error(429, "bin_full", "300")], seen, RetryPolicy(max_backoff_s=30))
    with pytest.raises(Overloaded) as info:
        c.submit("m", {})
    assert info.value.retry_after_s == 300 and sleeps == [] and len(seen) == 1


def test_a_4xx_is_not_retried(sleeps: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = client([error(400, "invalid_input")], seen)
    with pytest.raises(RequestRejected) as info:
        c.submit("m", {})
    assert info.value.status == 400 and info.value.code == "invalid_input" and len(seen) == 1


def test_the_api_key_and_wait_are_sent() -> None:
    seen: list[httpx.Request] = []
    c = client([done("j", 1)], seen, api_key="k1")
    c.submit("m", {"v": 1}, wait=5, priority=3)
    assert seen[0].headers["Authorization"] == "Bearer k1"
    assert seen[0].url.params["wait"] == "5" and b'"priority":3' in seen[0].content


def test_run_and_map_send_their_timeout_as_the_jobs_deadline() -> None:
    seen: list[httpx.Request] = []
    batch = httpx.Response(200, json={"jobs": [{"id": "a", "model": "m", "status": "done",
                                                "result": 1}]})
    c = client([done("j", 1), batch, done("k", 2)], seen)
    c.run("m", {}, timeout_s=7.5)
    c.map("m", [{}], timeout_s=120)
    c.submit("m", {})  # no timeout said: no header
    assert float(seen[0].headers["X-Carpool-Timeout"]) == 7.5
    assert 119 < float(seen[1].headers["X-Carpool-Timeout"]) <= 120
    assert "X-Carpool-Timeout" not in seen[2].headers


def test_the_async_client_sends_its_timeout_too() -> None:
    seen: list[httpx.Request] = []
    batch = httpx.Response(200, json={"jobs": [{"id": "a", "model": "m", "status": "done",
                                                "result": 1}]})

    async def main() -> None:
        async with AsyncClient("http://carpool.test", transport=httpx.MockTransport(
                scripted([done("j", 1), batch], seen))) as c:
            await c.run("m", {}, timeout_s=3)
            await c.map("m", [{}], timeout_s=50)

    asyncio.run(main())
    assert float(seen[0].headers["X-Carpool-Timeout"]) == 3
    assert 49 < float(seen[1].headers["X-Carpool-Timeout"]) <= 50


def test_a_failed_job_raises_job_failed() -> None:
    answer = httpx.Response(200, json={"id": "j", "model": "m", "status": "expired",
                                       "error": "deadline passed while queued"})
    with pytest.raises(JobFailed, match="expired: deadline passed"):
        client([answer], []).run("m", {})


def test_map_retries_only_the_refused_items_and_keeps_the_order(sleeps: list[float]) -> None:
    seen: list[httpx.Request] = []
    first = httpx.Response(200, json={"jobs": [
        {"id": "a", "model": "m", "status": "done", "result": "A"},
        {"error": {"code": "bin_full", "message": "m"}, "status": 429, "retry_after_s": 2},
    ]})
    second = httpx.Response(200, json={"jobs": [
        {"id": "b", "model": "m", "status": "done", "result": "B"}]})
    assert client([first, second], seen).map("m", ["in-a", "in-b"]) == ["A", "B"]
    assert b"in-b" in seen[1].content and b"in-a" not in seen[1].content
    assert sleeps and sleeps[0] >= 2


def test_nothing_listening_raises_server_unreachable(sleeps: list[float]) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    c = Client("http://carpool.test", retry=RetryPolicy(attempts=2),
               transport=httpx.MockTransport(refuse))
    with pytest.raises(ServerUnreachable, match="nothing answers at http://carpool.test"):
        c.result("j")
    assert len(sleeps) == 1


def test_the_async_client_retries_like_the_sync_one(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    monkeypatch.setattr("carpool.client.aio.asyncio.sleep", fake_sleep)
    answers = iter([error(429, "bin_full", "2"), done("j", 7)])

    async def main() -> Any:
        transport = httpx.MockTransport(lambda request: next(answers))
        async with AsyncClient("http://carpool.test", transport=transport) as c:
            return await c.run("m", {})

    assert asyncio.run(main()) == 7 and slept and slept[0] >= 2


def test_the_client_imports_neither_torch_nor_flask() -> None:
    code = ("import sys, carpool.client; "
            "print(sorted(m for m in ('torch', 'flask', 'celery') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"
