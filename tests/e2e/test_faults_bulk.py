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
from tests.support.bulk import (
    CATALOGUE_TOML,
    FINAL,
    SLOW_COST_MS,
    SLOW_MODEL_TOML,
    embedding_lines,
    lines_of,
    start_feeder,
    wait_batch,
)
from tests.support.faults import record
from tests.support.feeder_held import HELD
from tests.support.procs import log_says, start_web, start_worker
from tests.support.redisproc import private_redis
from worker.handlers.hashembed import hash_vector

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


#: Lines of the batch that loses its input, and how many are done when it does: at
#: most 80 lines a second (hslow), so hundreds are still queued or unread then.
DOOMED_LINES = 400
DELETE_AFTER = 40


@pytest.mark.parametrize(("how", "restart"), [("delete", True), ("delete", False),
                                              ("store", True), ("store", False)])
def test_a_batch_that_loses_its_input_keeps_its_finished_lines_and_errors_the_rest(
        how: str, restart: bool, tmp_path: Path) -> None:
    """The input goes away while lines run: by ``files.delete`` or from under the file
    store (the folder's file removed); with or without a kill -9 of the feeder then.
    The batch ends ``failed`` with both files: every finished line in the output, every
    other in the error file (``input_file_deleted``), the counts those of the files."""
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML + SLOW_MODEL_TOML)
    with ExitStack() as stack:
        env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:8]}",
                       CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                       CARPOOL_FILES_DIR=str(tmp_path / "files"),
                       CARPOOL_SYNTHETIC_COST_MS=SLOW_COST_MS)
        stack.callback(drop_keys, env["CARPOOL_KEY_PREFIX"])
        base_url = stack.enter_context(start_web(env))
        stack.enter_context(start_worker({**env, "CARPOOL_MODELS": "hslow"}))
        feeder = stack.enter_context(start_feeder(env, tmp_path / "feeder.log"))
        client = stack.enter_context(openai.OpenAI(base_url=f"{base_url}/v1", api_key="-"))
        file_id = client.files.create(file=("a.jsonl", io.BytesIO(
            embedding_lines(DOOMED_LINES, model="hslow", prefix="d"))), purpose="batch").id
        doomed = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                       completion_window="24h")
        done_before = wait_counts(client, doomed.id, DELETE_AFTER)
        if how == "delete":
            client.files.delete(file_id)
        else:
            (tmp_path / "files" / "files" / file_id).unlink()
        if restart:
            feeder.kill()
            feeder.wait()
            stack.enter_context(start_feeder(env, tmp_path / "feeder.log"))
        fine = client.batches.create(input_file_id=client.files.create(
            file=("b.jsonl", io.BytesIO(embedding_lines(20, model="hslow"))),
            purpose="batch").id, endpoint="/v1/embeddings", completion_window="24h")
        failed = wait_batch(client, doomed.id, FINAL, timeout_s=120)
        assert failed.status == "failed", failed
        assert failed.errors is not None and failed.errors.data[0].code == "input_file_deleted"
        assert file_id in str(failed.errors.data[0].message)
        out, err = lines_of(client, failed.output_file_id), lines_of(client, failed.error_file_id)
        ids = [line["custom_id"] for line in out + err]
        assert len(ids) == DOOMED_LINES, f"{len(ids) - len(set(ids))} duplicated"
        assert set(ids) == {f"d-{i}" for i in range(DOOMED_LINES)}
        assert len(out) >= done_before and err
        for line in out:
            text = "text number " + line["custom_id"].split("-")[1]
            assert line["response"]["body"]["data"][0]["embedding"] == pytest.approx(
                hash_vector(text, 8), abs=1e-6)
        assert all(line["error"]["code"] == "input_file_deleted" for line in err), err[:3]
        assert all(file_id in line["error"]["message"] for line in err)
        counts = failed.request_counts
        assert counts is not None and (counts.total, counts.completed, counts.failed) == (
            DOOMED_LINES, len(out), len(err))
        assert wait_batch(client, fine.id, FINAL, 60).status == "completed"
        record(f"batch input lost ({how}, restart={restart})", lines=DOOMED_LINES,
               output=len(out), errors=len(err))


def wait_counts(client: openai.OpenAI, batch_id: str, at_least: int) -> int:
    """Lines completed once at least ``at_least`` are."""
    box = [0]

    def far_enough() -> bool:
        b = client.batches.retrieve(batch_id)
        box[0] = b.request_counts.completed if b.request_counts else 0
        return box[0] >= at_least

    wait_until(far_enough, 60, f"{at_least} lines of {batch_id} completed")
    return box[0]
