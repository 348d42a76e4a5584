"""Webhooks end to end: real gunicorn, a Celery worker, the dispatcher and a receiver on
loopback. Each terminal event arrives once per webhook-id, signed; the job shows its
delivery; forbidden targets are never contacted; redirects are not followed."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.outbox import Outbox
from carpool.backend.queue import Queue
from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import new_job_id
from carpool.core.webhooks import hook_field
from carpool.stack.redis_local import start_redis
from tests.conftest import make_env
from tests.support.hookstack import (
    DEPLOY_SECRET,
    KEY_OWN,
    KEY_SECRET,
    KEY_SHARED,
    body_of,
    document,
    hook_env,
    outbox_empty,
    submit,
)
from tests.support.procs import (
    REPO_ROOT,
    answers,
    free_port,
    start_dispatcher,
    start_web,
    start_worker,
    wait_until,
)
from tests.support.promtext import scrape
from tests.support.receiver import receiver
from tests.support.redisproc import RedisProc, private_redis

ARRIVAL_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProc]:
    with private_redis() as s:
        yield s


def test_every_terminal_webhook_arrives_signed_and_once_per_id_with_two_dispatchers(
        server: RedisProc, key_prefix: str) -> None:
    env = make_env(server.url, key_prefix, **hook_env())
    client = connect(server.url)
    outbox = Outbox(client, Keys(key_prefix))
    ports = (free_port(), free_port())
    metrics = [f"http://127.0.0.1:{port}/metrics" for port in ports]
    with receiver() as rx, start_web(env) as base, start_worker(env), \
            start_dispatcher(env, ports[0]), start_dispatcher(env, ports[1]):
        own = [i for _ in range(5) for i in submit(base, KEY_OWN, f"{rx.url}/own")]
        shared = submit(base, KEY_SHARED, f"{rx.url}/shared", n=10, events=["running", "done"])
        want = {f"{i}.done" for i in own + shared} | {f"{i}.running" for i in shared}
        rx.wait_for_ids(want, ARRIVAL_TIMEOUT_S)
        wait_until(lambda: outbox_empty(outbox), ARRIVAL_TIMEOUT_S, "the outbox to empty")
        got = rx.all()
        assert Counter(r.webhook_id for r in got) == Counter(want)  # once each, no other
        for r in got:
            doc = body_of(r)
            secret = KEY_SECRET if r.path == "/own" else DEPLOY_SECRET
            assert Webhook(secret).verify(r.body, r.headers) == doc
            assert r.webhook_id == f"{doc['id']}.{doc['event']}"
            assert r.headers["content-type"] == "application/json"
        dones = [body_of(r) for r in got if r.webhook_id.endswith(".done")]
        assert {d["status"] for d in dones} == {"done"}
        assert all("result" in d and "webhook" not in d for d in dones)
        doc = document(base, KEY_SHARED, shared[0])
        assert doc["webhook"] == {"state": "delivered", "attempts": 1, "last_status": 200,
                                  "last_error": None, "event": "done"}
        scrapes = [scrape(url) for url in metrics]  # the two dispatchers' counts add up
        assert sum(m.value("carpool_webhook_deliveries_total", outcome="delivered")
                   for m in scrapes) == len(want)
        assert sum(m.value("carpool_webhook_deliveries_total", outcome="dead")
                   for m in scrapes) == 0
        assert sum(m.value("carpool_webhook_delivery_latency_seconds_count")
                   for m in scrapes) == len(want)
    client.close()


def loopback_name() -> str:
    """This host's name, when it resolves to a loopback or private address (the web
    cannot judge it at submit: only the dispatcher, after resolving it)."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except OSError:
        pytest.skip(f"{name} does not resolve")
    if not all(ipaddress.ip_address(i[4][0]).is_private for i in infos):
        pytest.skip(f"{name} resolves to a public address here")
    return name


def test_forbidden_targets_are_refused_and_never_contacted(server: RedisProc,
                                                          key_prefix: str) -> None:
    """Without CARPOOL_WEBHOOK_ALLOW_PRIVATE: literals are refused at submit (400), and
    events already recorded for them (or for a name that resolves to loopback) are
    dead-lettered by the dispatcher without a connection."""
    env = make_env(server.url, key_prefix,
                   **{**hook_env(), "CARPOOL_WEBHOOK_ALLOW_PRIVATE": "0"})
    client = connect(server.url)
    queue = Queue(client, Keys(key_prefix))
    spec = load_catalogue(None).get("synthetic")
    with receiver() as rx, start_web(env) as base:
        port = rx.port
        targets = [f"http://127.0.0.1:{port}/", f"http://[::1]:{port}/",
                   "http://169.254.169.254/latest/meta-data/", f"http://10.0.0.1:{port}/",
                   f"http://localhost:{port}/", "file:///etc/passwd"]
        for url in targets:
            resp = httpx.post(f"{base}/submit", timeout=10,
                              headers={"Authorization": f"Bearer {KEY_SHARED}"},
                              json={"model": "synthetic", "input": {"value": 0, "size": 1},
                                    "webhook": url})
            assert resp.status_code == 400, (url, resp.text)
            assert "webhook" in resp.json()["error"]["message"]
        # The same targets, and a name that resolves to loopback, recorded anyway (a
        # job admitted under other settings): the dispatcher refuses each.
        name_url = f"http://{loopback_name()}:{port}/"
        ids = []
        for url in [*targets, name_url]:
            job = AdmitJob(spec.bins[0], new_job_id(spec.name), '{"value": 0, "size": 1}')
            Admissions(client, queue.keys).admit(AdmitRequest(
                spec, (job,), queued_ttl_s=60, hook=hook_field(url, ("cancelled",))))
            assert queue.cancel(job.id, 60) == "cancelled"
            ids.append(job.id)
        with start_dispatcher(env):
            wait_until(lambda: all(queue.get(i).webhook["state"] == "dead"  # type: ignore
                                   for i in ids), ARRIVAL_TIMEOUT_S, "every event refused")
        for job_id in ids:
            hook = queue.get(job_id).webhook  # type: ignore[union-attr]
            assert hook is not None and hook["attempts"] == 1 and hook["last_status"] is None
            assert "refused" in hook["last_error"] or "scheme" in hook["last_error"]
        assert rx.all() == []
    client.close()


def test_a_redirect_is_not_followed(server: RedisProc, key_prefix: str) -> None:
    env = make_env(server.url, key_prefix, **hook_env(CARPOOL_WEBHOOK_MAX_AGE_S="2"))
    with receiver() as target, \
            receiver(lambda _n, _r: (302, {"Location": f"{target.url}/stolen"})) as rx, \
            start_web(env) as base, start_worker(env), start_dispatcher(env):
        (job,) = submit(base, KEY_SHARED, f"{rx.url}/hook")
        wait_until(lambda: document(base, KEY_SHARED, job)["webhook"]["state"] == "dead",
                   ARRIVAL_TIMEOUT_S, "the redirecting receiver's event to die")
        hook = document(base, KEY_SHARED, job)["webhook"]
        assert hook["last_status"] == 302 and "not followed" in hook["last_error"]
        assert rx.all() and target.all() == []


def test_carpool_up_starts_a_dispatcher_that_delivers(tmp_path: Path) -> None:
    port = free_port()
    redis_server = start_redis(tmp_path / "redis")
    env = {**os.environ, "CARPOOL_WORKER_METRICS_PORT": "0", "CARPOOL_MODELS": "synthetic",
           "CARPOOL_WEBHOOK_ALLOW_PRIVATE": "1", "CARPOOL_WEBHOOK_SECRET": DEPLOY_SECRET,
           "CARPOOL_DISPATCH_METRICS_PORT": str(free_port())}
    env.pop("CARPOOL_API_KEYS", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "carpool.cli", "up", "--no-flower", "--port", str(port),
         "--redis-url", redis_server.url, "--state-dir", str(tmp_path / "state")],
        env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(f"{base}/readyz"), ARRIVAL_TIMEOUT_S, "carpool up's web")
        with receiver() as rx:
            resp = httpx.post(f"{base}/submit", timeout=10, json={
                "model": "synthetic", "input": {"value": 1, "size": 1},
                "webhook": f"{rx.url}/up"})
            assert resp.status_code == 202, resp.text
            job = resp.json()["id"]
            rx.wait_for_ids({f"{job}.done"}, ARRIVAL_TIMEOUT_S)
            (got,) = rx.all()
            assert Webhook(DEPLOY_SECRET).verify(got.body, got.headers)["id"] == job
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        redis_server.stop()
