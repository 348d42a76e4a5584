"""kill -9 of the feeder, of a worker and of Redis (AOF) during a batch: afterwards
every line is in exactly one of the output and error files, none twice."""

from __future__ import annotations

import io
import signal
import uuid
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.batches import (
    CATALOGUE_TOML,
    embedding_lines,
    lines_of,
    start_feeder,
    wait_batch,
)
from tests.support.faults import record
from tests.support.feeder_held import HELD
from tests.support.procs import log_says, start_web, start_worker
from tests.support.redisproc import private_redis

pytestmark = pytest.mark.e2e

LINES = 6000
#: Lines stored before the kill: the batch is well under way, far from its end.
KILL_AFTER = 1000
#: Short leases: a killed worker's claims come back within seconds.
LEASE_MS = "3000"


@pytest.mark.parametrize("victim", ["feeder", "worker", "redis"])
def test_kill_9_during_a_batch_leaves_every_line_in_exactly_one_file(
        victim: str, tmp_path: Path) -> None:
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    with private_redis("--appendonly", "yes", "--appendfsync", "everysec") as server, \
            ExitStack() as stack:
        env = make_env(server.url, f"test-{uuid.uuid4().hex[:8]}",
                       CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                       CARPOOL_FILES_DIR=str(tmp_path / "files"),
                       CARPOOL_SYNTHETIC_COST_MS="2,0.05", CARPOOL_LEASE_MS=LEASE_MS)
        worker_env = {**env, "CARPOOL_MODELS": "hemb"}
        base_url = stack.enter_context(start_web(env))
        worker = stack.enter_context(start_worker(worker_env))
        feeder = stack.enter_context(start_feeder(env, tmp_path / "feeder.log"))
        client = stack.enter_context(openai.OpenAI(base_url=f"{base_url}/v1", api_key="-",
                                                   max_retries=5))
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(embedding_lines(LINES))),
                                      purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                      completion_window="24h")
        wait_batch_counts(client, batch.id)
        if victim == "feeder":
            feeder.kill()
            feeder.wait()
            stack.enter_context(start_feeder(env, tmp_path / "feeder.log"))
        elif victim == "worker":
            worker.kill()
            worker.wait()
            stack.enter_context(start_worker(worker_env, node_name="w2@carpool-test"))
        else:
            server.kill()
            server.restart()
        done = wait_batch(client, batch.id, {"completed", "failed"}, timeout_s=180)
        assert done.status == "completed", done
        out, err = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
        ids = [line["custom_id"] for line in out + err]
        assert len(ids) == LINES, f"{len(ids) - len(set(ids))} duplicated"
        assert set(ids) == {f"req-{i}" for i in range(LINES)}
        record(f"batch, kill -9 of the {victim}", lines=LINES, output=len(out), errors=len(err),
               duplicates=len(ids) - len(set(ids)))


def wait_batch_counts(client: openai.OpenAI, batch_id: str) -> None:
    from carpool.stack.waiting import wait_until

    def far_enough() -> bool:
        b = client.batches.retrieve(batch_id)
        return b.request_counts is not None and b.request_counts.completed >= KILL_AFTER

    wait_until(far_enough, 120, f"{KILL_AFTER} lines stored")


@pytest.mark.parametrize("point", ["admitted:3", "chunk:3", "finalize:1"])
def test_a_feeder_stopped_between_two_writes_resumes_without_losing_or_repeating_a_line(
        point: str, tmp_path: Path) -> None:
    """SIGKILL at the points no kill from outside can time: after admitting lines but
    before recording them, after writing a chunk but before marking it, after writing
    the files but before the final status. The feeder is held there by a test-side
    launcher (tests/support/feeder_held.py); the shipped feeder has no crash switch."""
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    lines = 3000
    with ExitStack() as stack:
        env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:8]}",
                       CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                       CARPOOL_FILES_DIR=str(tmp_path / "files"),
                       CARPOOL_SYNTHETIC_COST_MS="2,0.05")
        stack.callback(drop_keys, env["CARPOOL_KEY_PREFIX"])
        base_url = stack.enter_context(start_web(env))
        stack.enter_context(start_worker({**env, "CARPOOL_MODELS": "hemb"}))
        held = stack.enter_context(start_feeder(env, tmp_path / "held.log", held_at=point))
        client = stack.enter_context(openai.OpenAI(base_url=f"{base_url}/v1", api_key="-"))
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(embedding_lines(lines))),
                                      purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                      completion_window="24h")
        wait_until(lambda: log_says(tmp_path / "held.log", f"{HELD} {point}"), 120,
                   f"the feeder held at {point}")
        held.send_signal(signal.SIGKILL)
        assert held.wait(timeout=30) == -signal.SIGKILL
        stack.enter_context(start_feeder(env, tmp_path / "feeder.log"))
        done = wait_batch(client, batch.id, {"completed", "failed"}, timeout_s=120)
        assert done.status == "completed", done
        out, err = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
        ids = [line["custom_id"] for line in out + err]
        assert len(ids) == lines, f"{len(ids) - len(set(ids))} duplicated"
        assert set(ids) == {f"req-{i}" for i in range(lines)}
        assert done.request_counts is not None and done.request_counts.completed == lines


def drop_keys(prefix: str) -> None:
    from carpool.backend.connection import connect
    from carpool.backend.keys import Keys

    client = connect(REDIS_URL)
    keys = [k for pattern in Keys(prefix).patterns
            for k in client.scan_iter(match=pattern, count=1000)]
    if keys:
        client.delete(*keys)
    client.close()


def test_a_batch_whose_input_was_deleted_fails_at_the_feeders_restart_and_others_run(
        tmp_path: Path) -> None:
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    with ExitStack() as stack:
        env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:8]}",
                       CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                       CARPOOL_FILES_DIR=str(tmp_path / "files"),
                       CARPOOL_SYNTHETIC_COST_MS="20,1")
        stack.callback(drop_keys, env["CARPOOL_KEY_PREFIX"])
        base_url = stack.enter_context(start_web(env))
        stack.enter_context(start_worker({**env, "CARPOOL_MODELS": "hemb"}))
        feeder = stack.enter_context(start_feeder(env, tmp_path / "feeder.log"))
        client = stack.enter_context(openai.OpenAI(base_url=f"{base_url}/v1", api_key="-"))
        doomed_file = client.files.create(
            file=("a.jsonl", io.BytesIO(embedding_lines(5000, prefix="d"))), purpose="batch").id
        doomed = client.batches.create(input_file_id=doomed_file, endpoint="/v1/embeddings",
                                       completion_window="24h")
        wait_batch(client, doomed.id, {"in_progress"}, timeout_s=30)
        client.files.delete(doomed_file)
        feeder.kill()
        feeder.wait()
        fine = client.batches.create(input_file_id=client.files.create(
            file=("b.jsonl", io.BytesIO(embedding_lines(50))), purpose="batch").id,
            endpoint="/v1/embeddings", completion_window="24h")
        stack.enter_context(start_feeder(env, tmp_path / "feeder.log"))
        failed = wait_batch(client, doomed.id, {"failed", "completed"}, timeout_s=60)
        assert failed.status == "failed" and failed.errors is not None
        assert "was deleted" in str(failed.errors.data[0].message)
        assert wait_batch(client, fine.id, {"completed", "failed"}, 60).status == "completed"
