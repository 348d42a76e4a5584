"""End to end, the event streams and the job document, against real gunicorn and a real
Celery worker: a job behind a backlog, resuming with Last-Event-ID, one stream of many
jobs, owner scoping, the per-client cap, and the client's handle and commands."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from carpool.backend.connection import connect
from carpool.client import AsyncClient, Client, Event
from carpool.client.sse import SseParser
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import start_web, start_worker

#: A bound against hanging: the backlog below drains in about 4 s.
WAIT_S = 60.0
KEY_A, KEY_B, KEY_C = ("a" * 24, "b" * 24, "c" * 24)
CAP = 3
#: One job at a time, 400 ms each: a backlog that drains slowly enough to watch.
SLOW_TOML = """
[models.slow]
kind = "synthetic"
measure = "size"
[[models.slow.bins]]
name = "only"
max_size = 10
max_batch = 1
max_wait_ms = 1
max_depth = 1000

[models.idle]
kind = "synthetic"
measure = "size"
[[models.idle.bins]]
name = "only"
max_size = 10
max_batch = 1
max_wait_ms = 1
max_depth = 1000
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = tmp_path_factory.mktemp("cfg") / "catalogue.toml"
    cfg.write_text(SLOW_TOML)
    env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}", CARPOOL_CONFIG=str(cfg),
                   CARPOOL_SYNTHETIC_COST_MS="400,0", CARPOOL_API_KEYS=f"{KEY_A},{KEY_B},{KEY_C}",
                   CARPOOL_MAX_POLLS_PER_CLIENT=str(CAP), CARPOOL_WEB_WORKERS="1")
    with start_web(env) as base_url, start_worker({**env, "CARPOOL_MODELS": "slow"}):
        yield base_url
    client = connect(REDIS_URL)
    keys = list(client.scan_iter(match="{" + env["CARPOOL_KEY_PREFIX"] + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def auth(key: str = KEY_A) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def submit(base: str, model: str = "slow", n: int = 1, key: str = KEY_A) -> list[str]:
    r = httpx.post(f"{base}/submit/batch", json={"model": model, "inputs": [
        {"value": i, "size": 1} for i in range(n)]}, headers=auth(key), timeout=30)
    assert r.status_code == 202, r.text
    return [job["id"] for job in r.json()["jobs"]]


def read_events(base: str, path: str, until: set[str] | None = None, last_id: str = "",
                key: str = KEY_A, stop_after: str | None = None) -> tuple[int, list[Event]]:
    """The stream's status and events, read until its end (or ``stop_after``'s event)."""
    headers = {**auth(key), **({"Last-Event-ID": last_id} if last_id else {})}
    parser, events = SseParser(), []
    with httpx.stream("GET", f"{base}{path}", headers=headers, timeout=WAIT_S) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, []
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            event = parser.feed(line)
            if event is not None:
                events.append(event)
                if event.event == stop_after:
                    break
    return 200, events


def test_a_job_behind_a_backlog_streams_queued_with_falling_positions_then_running_then_done(
        stack: str) -> None:
    ids = submit(stack, n=10)
    status, events = read_events(stack, f"/result/{ids[-1]}/events")
    assert status == 200
    names = [e.event for e in events]
    queued = [e for e in events if e.event == "queued"]
    assert names == ["queued"] * len(queued) + ["running", "done"], names
    positions = [e.data["queue_position"] for e in queued]
    assert positions == sorted(positions, reverse=True) and len(set(positions)) >= 2, positions
    assert positions[0] >= 5
    done = events[-1].data
    assert done["result"] is not None and done["attempts"] == 1
    assert done["created_at"] < done["started_at"] <= done["completed_at"]
    assert events[-2].data["started_at"] == done["started_at"]  # the claim's own time
    assert done["urls"]["events"] == f"/result/{ids[-1]}/events"


def test_last_event_id_resumes_after_the_state_the_client_saw(stack: str) -> None:
    job = submit(stack, n=3)[-1]
    _, first = read_events(stack, f"/result/{job}/events", stop_after="running")
    assert first[-1].event == "running"
    _, rest = read_events(stack, f"/result/{job}/events", last_id=first[-1].id)
    assert [e.event for e in rest] == ["done"]  # running is not told again
    status, none = read_events(stack, f"/result/{job}/events", last_id=rest[-1].id)
    assert status == 204 and none == []  # final and seen: an EventSource stops


def test_one_stream_follows_several_jobs_to_their_ends(stack: str) -> None:
    ids = submit(stack, n=3)
    _, events = read_events(stack, "/events?ids=" + ",".join(ids))
    for job_id in ids:
        mine = [e.event for e in events if e.data["id"] == job_id]
        assert mine[-2:] == ["running", "done"], mine
    assert len(events[-1].id) == 3 and events[-1].id == events[-1].id[0] * 3


def test_another_keys_job_is_not_found_on_either_stream(stack: str) -> None:
    job = submit(stack, model="idle")[0]
    assert read_events(stack, f"/result/{job}/events", key=KEY_B)[0] == 404
    assert read_events(stack, f"/events?ids={job}", key=KEY_B)[0] == 404
    r = httpx.get(f"{stack}/result/{job}", headers=auth(KEY_B), timeout=10)
    assert r.status_code == 404  # as a read says


def test_streams_count_against_the_per_client_cap_and_free_it_when_dropped(stack: str) -> None:
    jobs = submit(stack, model="idle", n=2, key=KEY_C)  # no worker serves idle
    held = [httpx.stream("GET", f"{stack}/result/{jobs[0]}/events", headers=auth(KEY_C),
                         timeout=WAIT_S) for _ in range(CAP)]
    opened = [s.__enter__() for s in held]
    try:
        assert all(r.status_code == 200 for r in opened)
        r = httpx.get(f"{stack}/events?ids={jobs[1]}", headers=auth(KEY_C), timeout=10)
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_polls"
        assert httpx.get(f"{stack}/result/{jobs[1]}?wait=1", headers=auth(KEY_C),
                         timeout=10).status_code == 429  # the same cap as long-polls
        assert httpx.get(f"{stack}/result/{jobs[1]}/events", headers=auth(KEY_A),
                         timeout=10).status_code == 404  # another client, its own slots
    finally:
        for s in held[:1]:
            s.__exit__(None, None, None)
    try:
        def slot_free() -> bool:
            with httpx.stream("GET", f"{stack}/result/{jobs[1]}/events", headers=auth(KEY_C),
                              timeout=WAIT_S) as r:
                return r.status_code == 200
        wait_until(slot_free, 10, "a dropped stream's slot to come free")
    finally:
        for s in held[1:]:
            s.__exit__(None, None, None)


@pytest.mark.parametrize(("path", "headers", "status"), [
    ("/result/not-an-id/events", {}, 404),
    ("/result/" + "x" * 26 + "/events", {}, 404),
    ("/events", {}, 400),
    ("/events?ids=", {}, 400),
    ("/events?ids=nope", {}, 400),
    ("/events?ids=" + ",".join(["A" * 26] * 101), {}, 400),
    ("/events?ids=" + "," * 2000, {}, 400),
    ("/result/{job}/events", {"Last-Event-ID": "00"}, 400),
    ("/result/{job}/events", {"Last-Event-ID": "Z"}, 400),
    ("/result/{job}/events", {"Last-Event-ID": "\\u0000"}, 400),
    ("/result/{job}/events", {"Last-Event-ID": "0" * 3000}, 400),
    ("/events?ids={job},{job}", {}, 400),
    ("/result/{job}", {"Prefer": "wait=abc"}, 400),
    ("/result/{job}", {"Prefer": "wait=-1"}, 400),
    ("/result/{job}", {"Prefer": "wait"}, 400),
    ("/result/{job}", {"Prefer": "wait=1," + "x" * 2000}, 400),
])
def test_malformed_stream_and_prefer_requests_answer_4xx_with_a_message(
        stack: str, path: str, headers: dict[str, str], status: int) -> None:
    job = submit(stack, model="idle")[0]
    r = httpx.get(stack + path.replace("{job}", job), headers={**auth(), **headers},
                  timeout=10)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]


def test_prefer_wait_long_polls_and_says_what_it_applied(stack: str) -> None:
    job = submit(stack)[0]
    r = httpx.get(f"{stack}/result/{job}", headers={**auth(), "Prefer": "respond-async, wait=30"},
                  timeout=WAIT_S)
    assert r.status_code == 200 and r.json()["status"] == "done"
    assert r.headers["Preference-Applied"] == "wait=30"
    capped = httpx.get(f"{stack}/result/{job}", headers={**auth(), "Prefer": "wait=99999"},
                       timeout=WAIT_S)
    assert capped.headers["Preference-Applied"] == "wait=60"  # CARPOOL_MAX_WAIT_S
    both = httpx.get(f"{stack}/result/{job}?wait=0", headers={**auth(), "Prefer": "wait=5"},
                     timeout=WAIT_S)
    assert "Preference-Applied" not in both.headers  # ?wait= wins
    sub = httpx.post(f"{stack}/submit", json={"model": "slow", "input": {"value": 1, "size": 1}},
                     headers={**auth(), "Prefer": "wait=30"}, timeout=WAIT_S)
    assert sub.status_code == 200 and sub.headers["Preference-Applied"] == "wait=30"


def test_the_client_handle_waits_refreshes_cancels_and_follows_events(stack: str) -> None:
    with Client(stack, api_key=KEY_A) as client:
        assert client.health() == {"live": True, "ready": True}
        assert {m["name"] for m in client.models()} >= {"slow", "idle"}
        job = client.submit("slow", {"value": "h", "size": 1})
        events = list(job.events())
        assert [e.event for e in events][-2:] == ["running", "done"]
        assert job.refresh().status == "done" and job.wait().result == events[-1].data["result"]
        queued = client.submit("idle", {"value": 1, "size": 1})
        assert queued.refresh().queue_position is not None
        assert queued.cancel() is True and queued.refresh().status == "cancelled"

    async def follow() -> list[str]:
        async with AsyncClient(stack, api_key=KEY_A) as aclient:
            ajob = await aclient.submit("slow", {"value": "a", "size": 1})
            names = [e.event async for e in ajob.events()]
            assert (await ajob.wait()).status == "done"
            return names

    assert asyncio.run(follow())[-2:] == ["running", "done"]


def carpool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "carpool.cli", *args, "--api-key", KEY_A],
                          capture_output=True, text=True, timeout=WAIT_S, check=False)


def test_the_status_models_cancel_and_watch_commands_talk_to_the_stack(stack: str) -> None:
    status = carpool("status", "--url", stack)
    assert status.returncode == 0, status.stderr
    assert "ready yes" in status.stdout and any(
        line.startswith("slow") and "served" in line for line in status.stdout.splitlines())
    models = carpool("models", "--url", stack)
    assert {m["name"] for m in json.loads(models.stdout)} >= {"slow", "idle"}
    job = submit(stack, n=6)[-1]  # behind a backlog: still queued when watch starts
    watched = carpool("watch", job, "--url", stack)
    assert watched.returncode == 0, watched.stderr
    lines: list[Any] = [line.split(" ", 1) for line in watched.stdout.splitlines()]
    assert [name for name, _ in lines][-2:] == ["running", "done"] and lines[0][0] == "queued"
    assert json.loads(lines[-1][1])["id"] == job
    queued = submit(stack, model="idle")[0]
    cancelled = carpool("cancel", queued, "--url", stack)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    again = carpool("cancel", "x" * 26, "--url", stack)
    assert again.returncode == 1 and "404" in again.stderr
