"""End to end, one round trip per job: ``?wait=`` on submit, the Python client and the
``carpool submit``/``result`` commands, against real gunicorn + a real Celery worker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys, shard
from carpool.backend.queue import Queue
from carpool.client import AsyncClient, Client, Overloaded, RetryPolicy
from carpool.core.jobs import Outcome
from carpool.core.settings import load_settings
from carpool.core.synthetic import expected_result
from tests.conftest import TINY_TOML, make_env
from tests.support.procs import start_web, start_worker

#: A bound against hanging, far above a synthetic batch (a few ms).
WAIT_S = 30
#: A model no worker serves whose jobs may wait 1 s: the test makes its drain rate.
SLOWQ_TOML = """
[models.slowq]
kind = "synthetic"
measure = "size"
max_queue_ms = 1000
[[models.slowq.bins]]
name = "only"
max_size = 10
max_batch = 2
max_wait_ms = 5
max_depth = 1000
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    import uuid

    from tests.conftest import REDIS_URL

    cfg = tmp_path_factory.mktemp("cfg") / "catalogue.toml"
    cfg.write_text(TINY_TOML + SLOWQ_TOML)
    env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}", CARPOOL_CONFIG=str(cfg),
                   CARPOOL_SYNTHETIC_COST_MS="2,0.1")
    with start_web(env) as base_url, start_worker({**env, "CARPOOL_MODELS": "synthetic"}):
        yield base_url, env
    client = connect(REDIS_URL)
    keys = list(client.scan_iter(match="{" + env["CARPOOL_KEY_PREFIX"] + "}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_submit_with_wait_answers_200_with_the_result_inline(
        stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    job_input = {"value": {"inline": 1}, "size": 8}
    r = requests.post(f"{base}/submit?wait={WAIT_S}", json={"model": "synthetic",
                                                            "input": job_input}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "done" and body["result"] == expected_result(job_input)
    assert set(body["timings_ms"]) >= {"queue", "inference", "total"}
    # The same document GET /result gives.
    again = requests.get(f"{base}/result/{body['id']}", timeout=10).json()
    assert again == body


def test_submit_with_wait_for_an_unserved_model_answers_202_after_the_wait(
        stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    r = requests.post(f"{base}/submit?wait=0.3", json={"model": "tiny", "input": {
        "value": 1, "size": 1}}, timeout=30)
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued" and r.headers["Location"] == r.json()["result_url"]


def test_batch_with_wait_answers_200_with_every_result_in_place(
        stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    inputs = [{"value": i, "size": 8 if i % 2 else 100} for i in range(20)]
    bad = {"value": 1}  # no size: refused alone
    r = requests.post(f"{base}/submit/batch?wait={WAIT_S}", json={
        "model": "synthetic", "inputs": [*inputs, bad]}, timeout=60)
    assert r.status_code == 200, r.text
    jobs = r.json()["jobs"]
    assert [j["result"] for j in jobs[:-1]] == [expected_result(x) for x in inputs]
    assert jobs[-1]["status"] == 400 and "error" in jobs[-1]


def test_a_wait_over_the_cap_is_refused(stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    r = requests.post(f"{base}/submit?wait=100000", json={"model": "synthetic", "input": {
        "value": 1, "size": 1}}, timeout=30)
    assert r.status_code == 400 and "wait" in r.json()["error"]["message"]


def test_the_client_runs_and_maps_through_the_stack(stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    with Client(base) as client:
        assert client.run("synthetic", {"value": "one", "size": 4}) == expected_result(
            {"value": "one", "size": 4})
        inputs = [{"value": i, "size": 1 + i % 200} for i in range(50)]
        assert client.map("synthetic", inputs) == [expected_result(x) for x in inputs]
        job = client.submit("tiny", {"value": 2, "size": 1})
        assert job.status == "queued" and client.result(job.id).status == "queued"


def test_the_async_client_runs_and_maps_through_the_stack(
        stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    inputs = [{"value": f"a{i}", "size": 8} for i in range(30)]

    async def main() -> tuple[object, list[object]]:
        async with AsyncClient(base) as client:
            one = await client.run("synthetic", {"value": "x", "size": 2})
            return one, await client.map("synthetic", inputs)

    one, many = asyncio.run(main())
    assert one == expected_result({"value": "x", "size": 2})
    assert many == [expected_result(x) for x in inputs]


def test_a_full_bin_raises_overloaded_with_retry_after(
        stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    # tiny holds 3 jobs and no worker serves it; earlier tests may have queued some.
    with Client(base, retry=RetryPolicy(attempts=1)) as client:
        with pytest.raises(Overloaded) as info:
            for _ in range(4):
                client.submit("tiny", {"value": 0, "size": 1})
    assert info.value.status == 429 and (info.value.retry_after_s or 0) >= 1


def test_a_job_predicted_to_wait_too_long_is_refused_at_once_with_retry_after(
        stack: tuple[str, dict[str, str]]) -> None:
    base, env = stack
    settings = load_settings(env)
    spec = settings.catalogue.get("slowq")
    queue = Queue(connect(settings.redis_url), Keys(settings.key_prefix))
    # Drain 10 jobs as a worker would (claim.lua, complete.lua): about 10 jobs/s.
    with Client(base, retry=RetryPolicy(attempts=1)) as client:
        ids = [client.submit("slowq", {"value": i, "size": 1}).id for i in range(10)]
        claim = queue.claim(spec, "only", 10, lease_ms=10_000, token="t", worker="test")
        assert sorted(j.id for j in claim.jobs) == sorted(ids)
        # A batch that ran 1 s: its claim (the claim hash holds the claim time).
        queue.client.hset(queue.keys.claim(shard("slowq"), "t"), "t", claim.now_ms - 1000)
        queue.complete(spec, claim, [Outcome(j.id, result=1) for j in claim.jobs], {"size": 10})
        with pytest.raises(Overloaded) as info:
            for _ in range(spec.bins[0].max_depth):
                client.submit("slowq", {"value": 0, "size": 1})
    # At ~10 jobs/s about 10 may wait 1 s: refused long before max_depth (1000).
    assert info.value.code == "wait_too_long" and (info.value.retry_after_s or 0) >= 1
    assert queue.depths([("slowq", "only")])[0] <= 20
    queue.client.close()


def carpool_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "carpool.cli", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_carpool_submit_and_result_use_the_url_from_the_environment(
        stack: tuple[str, dict[str, str]]) -> None:
    base, _ = stack
    import os

    env = {**os.environ, "CARPOOL_URL": base}
    done = carpool_cli("submit", "--input", '{"value": "cli", "size": 3}', "--wait", "30",
                       env=env)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["status"] == "done" and body["result"] == expected_result(
        {"value": "cli", "size": 3})
    again = carpool_cli("result", body["id"], env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["id"] == body["id"]


def test_carpool_submit_says_in_one_line_when_nothing_listens(tmp_path: Path) -> None:
    from tests.support.procs import free_port

    done = carpool_cli("submit", "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "nothing answers at" in done.stderr


def test_carpool_submit_says_in_one_line_when_the_input_is_not_json() -> None:
    done = carpool_cli("submit", "--input", "{oops")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--input is not JSON" in done.stderr
