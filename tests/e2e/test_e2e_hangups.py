"""End to end, nobody computes for a caller who has gone: real gunicorn, a real Celery
worker, a real Redis. Callers of the synchronous endpoints hang up behind a backlog of
several seconds; their jobs still queued are cancelled, never computed, and every other
job is done. A caller's stated timeout (X-Carpool-Timeout) refuses or expires a job that
cannot start in time (web/common/sync_wait.py)."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.client import Client, Overloaded, RetryPolicy
from carpool.core.catalogue import Catalogue, load_catalogue
from carpool.core.jobs import JobStatus, JobView
from carpool.core.shards import shard
from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.procs import open_files_at_least, start_web, start_worker
from tests.support.promtext import scrape

pytestmark = pytest.mark.e2e

#: One worker serves slow and slowemb at 20 + 20·n ms a batch of n (a batch of 4 in
#: 100 ms: 40 jobs/s), so a backlog of 240 jobs takes about 6 s. No time bound on their
#: bins (max_queue_ms = 0), so a backlog is admitted whole; a priority level of slow is
#: worth 100 s, so a backlog of level 9 sorts ahead of any deadline a test gives. idle:
#: no worker serves it.
MODELS_TOML = """
[models.slow]
kind = "synthetic"
measure = "size"
max_queue_ms = 0
max_deadline_ms = 60000
priority_step_ms = 100000
[[models.slow.bins]]
name = "only"
max_size = 10
max_batch = 4
max_wait_ms = 5
max_depth = 5000

[models.slowemb]
kind = "hashembed"
measure = "tokens"
max_queue_ms = 0
[[models.slowemb.bins]]
name = "only"
max_size = 64
max_batch = 4
max_wait_ms = 5
max_depth = 5000

[models.idle]
kind = "synthetic"
measure = "size"
[[models.idle.bins]]
name = "only"
max_size = 10
max_batch = 4
max_wait_ms = 5
max_depth = 100
"""
BACKLOG = 240
#: Bounds against hanging: the backlog drains in seconds.
DRAIN_TIMEOUT_S = 90.0
ADMIT_TIMEOUT_S = 30.0


@dataclass
class Stack:
    base: str
    queue: Queue
    catalogue: Catalogue
    env: dict[str, str]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cfg = tmp_path_factory.mktemp("cfg") / "catalogue.toml"
    cfg.write_text(MODELS_TOML)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(cfg),
                   CARPOOL_SYNTHETIC_COST_MS="20,20")
    queue = Queue(connect(REDIS_URL), Keys(prefix))
    try:
        with start_web(env) as base, start_worker({**env, "CARPOOL_MODELS": "slow,slowemb"}):
            yield Stack(base, queue, load_catalogue(cfg), env)
    finally:
        keys = [k for pattern in queue.keys.patterns
                for k in queue.client.scan_iter(match=pattern, count=1000)]
        if keys:
            queue.client.delete(*keys)
        queue.client.close()


def submitted(stack: Stack, model: str) -> float:
    return scrape(f"{stack.base}/metrics").value("carpool_jobs_submitted_total", model=model)


def backlog(stack: Stack, model: str, n: int = BACKLOG, priority: int = 0) -> list[str]:
    """``n`` jobs queued at once (no wait): several seconds of work for the worker."""
    inputs = [{"text": f"backlog {i}"} if model == "slowemb"
              else {"value": f"backlog-{i}", "size": 1} for i in range(n)]
    r = requests.post(f"{stack.base}/submit/batch", json={
        "model": model, "inputs": inputs, "priority": priority}, timeout=30)
    assert r.status_code == 202, r.text
    return [job["id"] for job in r.json()["jobs"]]


def all_jobs(stack: Stack, model: str) -> list[str]:
    """Every job id of ``model`` that Redis holds (a fresh prefix: this test's own)."""
    pattern = stack.queue.keys.job_prefix(shard(model)) + "*"
    return [k.rsplit(":", 1)[1] for k in stack.queue.client.scan_iter(match=pattern,
                                                                       count=1000)]


def finals(stack: Stack, ids: Sequence[str]) -> list[JobView]:
    """The jobs' views once every one of them has ended."""
    views: list[JobView | None] = []

    def ended() -> bool:
        views[:] = stack.queue.get_many(list(ids))
        return all(v is not None and v.status.is_final for v in views)

    wait_until(ended, DRAIN_TIMEOUT_S, "every job to end")
    return [v for v in views if v is not None]


def hang_up(stack: Stack, model: str, path: str, bodies: Sequence[Any], jobs_each: int,
            headers: dict[str, str] | None = None) -> None:
    """Send each body as a synchronous request on its own connection; once the web has
    queued all their jobs, close every connection without reading an answer."""
    before = submitted(stack, model)
    conns = []
    for body in bodies:
        data = json.dumps(body).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        url = urlsplit(stack.base)
        conn = socket.create_connection((url.hostname, url.port))
        conn.sendall((f"POST {path} HTTP/1.1\r\nHost: carpool\r\nContent-Type: "
                      f"application/json\r\nContent-Length: {len(data)}\r\n{head}\r\n"
                      ).encode() + data)
        conns.append(conn)
    try:
        wait_until(lambda: submitted(stack, model) >= before + len(bodies) * jobs_each,
                   ADMIT_TIMEOUT_S, "the callers' jobs to be queued")
    finally:
        for conn in conns:
            conn.close()


def hung_up_jobs(stack: Stack, model: str, kept: Sequence[str], before: set[str],
                 expected: int) -> list[JobView]:
    """The final views of ``model``'s jobs queued since ``before`` (the jobs it held
    then); every ``kept`` job (the backlog) is done."""
    others = sorted(set(all_jobs(stack, model)) - before)
    assert len(others) == expected
    views = finals(stack, [*kept, *others])
    assert all(v.status is JobStatus.DONE for v in views[:len(kept)])
    return views[len(kept):]


def assert_hung_up_jobs_never_ran(views: Sequence[JobView], at_least: float) -> None:
    cancelled = [v for v in views if v.status is JobStatus.CANCELLED]
    assert len(cancelled) >= at_least * len(views), [v.status.value for v in views]
    assert all((v.error or "").startswith("client_gone") for v in cancelled)
    assert all(v.started_ms is None for v in cancelled)  # never claimed
    # Every other one ran to the end: none was cut off while running.
    assert all(v.status is JobStatus.DONE for v in views if v not in cancelled)


def test_sixty_callers_who_hang_up_on_wait_are_never_computed(stack: Stack) -> None:
    kept = backlog(stack, "slow")
    abandoned = scrape(f"{stack.base}/metrics").value("carpool_jobs_abandoned_total",
                                                      model="slow")
    bodies = [{"model": "slow", "input": {"value": f"gone-{i}", "size": 1}}
              for i in range(60)]
    before = set(all_jobs(stack, "slow"))
    hang_up(stack, "slow", "/submit?wait=30", bodies, 1)
    views = hung_up_jobs(stack, "slow", kept, before, 60)
    assert_hung_up_jobs_never_ran(views, 0.95)
    cancelled = sum(v.status is JobStatus.CANCELLED for v in views)
    assert scrape(f"{stack.base}/metrics").value(
        "carpool_jobs_abandoned_total", model="slow") - abandoned == cancelled


def test_callers_who_hang_up_on_v2_infer_are_never_computed(stack: Stack) -> None:
    kept = backlog(stack, "slow")
    before = set(all_jobs(stack, "slow"))
    body = {"inputs": [{"name": "VALUE", "datatype": "FP32", "shape": [2, 1],
                        "data": [1.0, 2.0]}]}
    hang_up(stack, "slow", "/v2/models/slow/infer", [body] * 10, 2)
    views = hung_up_jobs(stack, "slow", kept, before, 20)
    assert_hung_up_jobs_never_ran(views, 0.9)


def test_callers_who_hang_up_on_embeddings_are_never_computed(stack: Stack) -> None:
    kept = backlog(stack, "slowemb")
    bodies = [{"model": "slowemb", "input": [f"gone {i}", f"left {i}"]} for i in range(10)]
    before = set(all_jobs(stack, "slowemb"))
    hang_up(stack, "slowemb", "/v1/embeddings", bodies, 2)
    views = hung_up_jobs(stack, "slowemb", kept, before, 20)
    assert_hung_up_jobs_never_ran(views, 0.9)


def test_a_job_sent_with_an_idempotency_key_outlives_its_callers_hang_up(
        stack: Stack) -> None:
    """A retry with the key is to find it: the hang-up cancels nothing."""
    kept = backlog(stack, "slow")
    before = set(all_jobs(stack, "slow"))
    body = {"model": "slow", "input": {"value": "keyed", "size": 1}}
    hang_up(stack, "slow", "/submit?wait=30", [body], 1, {"Idempotency-Key": "once"})
    abandoned = scrape(f"{stack.base}/metrics").value("carpool_jobs_abandoned_total",
                                                      model="slow")
    (view,) = hung_up_jobs(stack, "slow", kept, before, 1)
    assert view.status is JobStatus.DONE
    assert scrape(f"{stack.base}/metrics").value("carpool_jobs_abandoned_total",
                                                 model="slow") == abandoned
    again = requests.post(f"{stack.base}/submit", json=body,
                          headers={"Idempotency-Key": "once"}, timeout=30).json()
    assert again["id"] == view.id and again.get("duplicate") is True


def test_a_caller_that_waits_past_its_answer_is_computed_for(stack: Stack) -> None:
    """The other side: a caller still connected gets its result, no cancel."""
    r = requests.post(f"{stack.base}/submit?wait=30", json={
        "model": "slow", "input": {"value": "stays", "size": 1}}, timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "done"


#: Idle connections held open to one web process: its sockets then number past
#: ``select.select``'s 1023, as a web serving a thousand callers has.
IDLE_CONNECTIONS = 1100
#: Its descriptors once it holds them all (its own files beside them).
FDS_PAST = 1100


@pytest.fixture
def many_fds() -> Iterator[None]:
    """Room for this test's connections (gunicorn inherits the limit); put back after."""
    with open_files_at_least(4 * IDLE_CONNECTIONS):
        yield


def server_fds(port: int) -> int:
    """The most descriptors a process holding accepted connections on ``port`` has."""
    pids = {c.pid for c in psutil.net_connections("tcp")
            if c.pid and c.laddr and c.laddr.port == port
            and c.status == psutil.CONN_ESTABLISHED}
    return max((psutil.Process(pid).num_fds() for pid in pids), default=0)


def test_a_caller_on_a_web_holding_a_thousand_connections_is_not_taken_for_gone(
        stack: Stack, many_fds: None) -> None:
    # One worker, and a first request may take its time (gunicorn reads it within the
    # keep-alive, 2 s by default): the idle connections stay while the caller waits.
    env = {**stack.env, "CARPOOL_WEB_WORKERS": "1", "GUNICORN_CMD_ARGS": "--keep-alive 300"}
    with start_web(env) as base:
        url = urlsplit(base)
        assert url.hostname is not None and url.port is not None
        idle = []
        try:
            for _ in range(IDLE_CONNECTIONS):  # a request begun, never finished
                conn = socket.create_connection((url.hostname, url.port))
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: carpool\r\n")
                idle.append(conn)
            wait_until(lambda: server_fds(url.port or 0) > FDS_PAST, ADMIT_TIMEOUT_S,
                       "the web to hold every idle connection")
            kept = backlog(stack, "slow", 80)  # about 2 s of work ahead of the caller
            # Accepted after the idle ones: a descriptor past 1100.
            r = requests.post(f"{base}/submit?wait=30", timeout=60,
                              json={"model": "slow", "input": {"value": "stays", "size": 1}})
        finally:
            for conn in idle:
                conn.close()
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done"
    finals(stack, kept)


def test_a_stated_timeout_that_cannot_be_met_is_refused_at_admission(stack: Stack) -> None:
    # A backlog that sorts ahead: a sooner deadline alone would go first (EDF).
    kept = backlog(stack, "slow", priority=9)
    # Once a few batches ran the pace is known: the backlog's seconds are predicted.
    wait_until(lambda: sum(v is not None and v.status.is_final
                           for v in stack.queue.get_many(kept[:40])) == 40,
               DRAIN_TIMEOUT_S, "the first batches of the backlog")
    job = {"model": "slow", "input": {"value": "hurry", "size": 1}}
    r = requests.post(f"{stack.base}/submit", json=job,
                      headers={"X-Carpool-Timeout": "1"}, timeout=30)
    assert r.status_code == 429 and r.json()["error"]["code"] == "wait_too_long", r.text
    with Client(stack.base, retry=RetryPolicy(attempts=1)) as client, \
            pytest.raises(Overloaded) as info:
        client.run("slow", job["input"], timeout_s=1)  # the client says so itself
    assert info.value.code == "wait_too_long"
    # Without a stated timeout the same job waits its turn (no time bound on slow).
    r = requests.post(f"{stack.base}/submit", json=job, timeout=30)
    assert r.status_code == 202, r.text
    finals(stack, [*kept, r.json()["id"]])


def test_a_stated_timeout_past_while_queued_expires_the_job_never_computed(
        stack: Stack) -> None:
    spec_name = "idle"
    r = requests.post(f"{stack.base}/submit", json={
        "model": spec_name, "input": {"value": 1, "size": 1}},
        headers={"X-Carpool-Timeout": "0.2"}, timeout=30)
    assert r.status_code == 202, r.text  # no worker serves idle: no pace, no prediction
    job_id = r.json()["id"]
    record = stack.queue.read_records([job_id])[0] or {}
    deadline_ms = int(record["deadline"])

    def redis_now_ms() -> int:
        s, us = stack.queue.client.time()
        return int(s) * 1000 + int(us) // 1000

    wait_until(lambda: redis_now_ms() > deadline_ms, 10, "the stated timeout to pass")
    claim = stack.queue.claim(stack.catalogue.get(spec_name), "only", 4, lease_ms=5000, token="t",
                              worker="test")  # as a worker would, with claim.lua
    assert claim.jobs == () and claim.expired == 1
    view = stack.queue.get(job_id)
    assert view is not None and view.status is JobStatus.EXPIRED
    assert view.error == "deadline passed while queued"
