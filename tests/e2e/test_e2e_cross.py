"""Webhooks, event streams, the job document and /v2 together, end to end: real gunicorn,
a Celery worker, the dispatcher and a receiver on loopback. A /v2 infer with a webhook
delivers one signed webhook per row; a job with a webhook streams to its end with its
delivery state on every event; its document and its webhook's body carry the times and
links."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from standardwebhooks import Webhook

from tests.conftest import make_env
from tests.e2e.test_e2e_events import read_events
from tests.support.hookstack import DEPLOY_SECRET, KEY_SHARED, body_of, document, hook_env, submit
from tests.support.procs import start_dispatcher, start_web, start_worker, wait_until
from tests.support.receiver import Receiver, receiver
from tests.support.redisproc import private_redis

httpclient = pytest.importorskip("tritonclient.http")

#: A bound against hanging: every job here ends within a second or two.
WAIT_S = 60.0
TIMES = ("created_at", "started_at", "completed_at")


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, Receiver]]:
    """The stack, and a receiver every test's webhooks go to (each under its own path)."""
    # 300 ms a batch: long enough for a stream opened after the submit to see it run.
    with private_redis() as server, receiver() as rx:
        env = make_env(server.url, "cross", CARPOOL_SYNTHETIC_COST_MS="300,0", **hook_env())
        with start_web(env) as base, start_worker(env), start_dispatcher(env):
            yield base, rx


def arrived(rx: Receiver, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The bodies of ``ids`` (webhook-ids), once each has arrived, checked signed."""
    rx.wait_for_ids(ids, WAIT_S)
    got = {r.webhook_id: r for r in rx.all() if r.webhook_id in ids}
    for r in got.values():
        assert Webhook(DEPLOY_SECRET).verify(r.body, r.headers) == body_of(r)
    return {i: body_of(r) for i, r in got.items()}


def test_a_v2_infer_with_a_webhook_delivers_a_signed_webhook_per_row(
        stack: tuple[str, Receiver]) -> None:
    base, rx = stack
    client = httpclient.InferenceServerClient(base.removeprefix("http://"))
    x = httpclient.InferInput("VALUE", [3, 2], "FP32")
    x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2))
    out = client.infer("synthetic", [x], headers={"Authorization": f"Bearer {KEY_SHARED}"},
                       parameters={"webhook": f"{rx.url}/v2", "webhook_events": "running,done"})
    ids = out.get_response()["parameters"]["carpool_job_ids"]
    assert len(ids) == 3
    bodies = arrived(rx, {f"{i}.{e}" for i in ids for e in ("running", "done")})
    for row, job_id in enumerate(ids):
        done = bodies[f"{job_id}.done"]
        assert done["status"] == "done" and done["event"] == "done"
        assert done["result"]["echo"] == [2.0 * row, 2.0 * row + 1]
        assert bodies[f"{job_id}.running"]["event"] == "running"
    assert {r.path for r in rx.all() if r.webhook_id.split(".")[0] in ids} == {"/v2"}
    client.close()


def test_a_job_with_a_webhook_streams_to_done_with_its_delivery_on_every_event(
        stack: tuple[str, Receiver]) -> None:
    base, rx = stack
    (job,) = submit(base, KEY_SHARED, f"{rx.url}/stream")
    status, events = read_events(base, f"/result/{job}/events", key=KEY_SHARED)
    assert status == 200
    names = [e.event for e in events]
    assert names[-1] == "done" and "running" in names, names
    assert all("webhook" in e.data for e in events), [e.data for e in events]
    done = events[-1].data
    assert done["result"] is not None and all(done[t] for t in TIMES)
    assert done["webhook"]["state"] in ("pending", "delivered")


def test_the_document_and_the_webhook_body_carry_times_links_and_the_delivery(
        stack: tuple[str, Receiver]) -> None:
    base, rx = stack
    (job,) = submit(base, KEY_SHARED, f"{rx.url}/doc", events=["running", "done"])
    bodies = arrived(rx, {f"{job}.running", f"{job}.done"})
    wait_until(lambda: document(base, KEY_SHARED, job)["webhook"]["state"] == "delivered",
               WAIT_S, "the done webhook's delivery on the job")
    doc = document(base, KEY_SHARED, job)
    assert doc["created_at"] <= doc["started_at"] <= doc["completed_at"]  # one ms may hold both
    assert doc["webhook"]["event"] == "done" and doc["urls"]["events"] == f"/result/{job}/events"
    body = bodies[f"{job}.done"]
    assert {k: body[k] for k in (*TIMES, "urls", "attempts")} == \
        {k: doc[k] for k in (*TIMES, "urls", "attempts")}
    assert "webhook" not in body
    # The running event's body: the claim's own time, as the job's stream shows it.
    running = bodies[f"{job}.running"]
    assert running["created_at"] == doc["created_at"] and running["urls"] == doc["urls"]
    assert running.get("started_at") == doc["started_at"], running
