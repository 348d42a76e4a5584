"""The feeder against a real Redis and a folder store, stepped by hand: a batch whose
input file is gone before validation, or gone (labels too) before a restarted feeder
loads it. (The input lost while lines run, with real processes and kills:
tests/e2e/test_faults_bulk.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from carpool.backend.bulkdb import BulkDb, bulk_document, new_bulk_id
from carpool.backend.filestore import LocalFileStore, store_name
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.bulk import BulkStatus
from carpool.core.errors import BackendUnavailable
from carpool.core.settings import Settings, load_settings
from feeder import intake
from feeder.feeder import Feeder
from feeder.labels import labels_name
from tests.conftest import make_env
from tests.support.bulk import CATALOGUE_TOML, embedding_lines

LINES = 5


@pytest.fixture
def feeder_settings(tmp_path: Path, redis_url: str, key_prefix: str) -> Settings:
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    return load_settings(make_env(redis_url, key_prefix,
                                  CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                                  CARPOOL_FILES_DIR=str(tmp_path / "files")))


def new_feeder(settings: Settings, client: redis.Redis, keys: Keys) -> Feeder:
    return Feeder(settings, Queue(client, keys), BulkDb(client, keys),
                  LocalFileStore(settings.bulk.files_dir))


def add_batch(db: BulkDb, store: LocalFileStore, file_id: str, data: bytes | None = None
              ) -> str:
    """A batch as the web creates it, its input (default: LINES hemb lines) in the store."""
    store.put(store_name(file_id), embedding_lines(LINES) if data is None else data)
    now = int(time.time())
    batch_id = new_bulk_id()
    db.add_bulk({"id": batch_id, "owner": "", "endpoint": "/v1/embeddings",
                  "input_file_id": file_id, "completion_window": "24h", "window_s": 86400,
                  "metadata": "", "created_at": now, "expires_at": now + 86400,
                  "status": "validating", "total": 0, "completed": 0, "failed": 0,
                  "chunks": 0, "webhook": ""}, 3600)
    return batch_id


def document(db: BulkDb, batch_id: str) -> dict[str, Any]:
    view = db.bulk(batch_id)
    assert view is not None
    return bulk_document(view)


def test_an_input_deleted_before_validation_fails_the_batch_naming_the_file(
        feeder_settings: Settings, client: redis.Redis, keys: Keys) -> None:
    feeder = new_feeder(feeder_settings, client, keys)
    batch_id = add_batch(feeder.db, feeder.store, "file-gone")
    feeder.store.delete(store_name("file-gone"))
    feeder.step()
    doc = document(feeder.db, batch_id)
    assert doc["status"] == "failed"
    assert [e["code"] for e in doc["errors"]["data"]] == ["input_file_deleted"]
    assert "file-gone" in doc["errors"]["data"][0]["message"]
    assert doc["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert doc["output_file_id"] is None and doc["error_file_id"] is None


@pytest.mark.parametrize("labels_kept", [True, False])
def test_a_restarted_feeder_errors_every_line_of_a_batch_whose_input_is_gone(
        labels_kept: bool, feeder_settings: Settings, client: redis.Redis,
        keys: Keys) -> None:
    """Validated, then the input deleted while the feeder was down: every line is in the
    error file under its custom_id (or, with the labels lost too, its number)."""
    first = new_feeder(feeder_settings, client, keys)
    batch_id = add_batch(first.db, first.store, "file-in")
    first.step()
    assert document(first.db, batch_id)["status"] == "in_progress"
    first.store.delete(store_name("file-in"))
    if not labels_kept:
        first.store.delete(labels_name(batch_id))
    restarted = new_feeder(feeder_settings, client, keys)
    restarted.step()
    doc = document(restarted.db, batch_id)
    assert doc["status"] == "failed", doc
    assert doc["errors"]["data"][0]["code"] == "input_file_deleted"
    assert doc["output_file_id"] is None and doc["error_file_id"] is not None
    data = restarted.store.get(store_name(doc["error_file_id"]))
    err = [json.loads(line) for line in (data or b"").decode().splitlines()]
    assert [e["error"]["code"] for e in err] == ["input_file_deleted"] * LINES
    if labels_kept:
        assert [e["custom_id"] for e in err] == [f"req-{i}" for i in range(LINES)]
    else:
        assert [e["custom_id"] for e in err] == [None] * LINES
        assert [f"request {i + 1} of the input file" in e["error"]["message"]
                for i, e in enumerate(err)] == [True] * LINES
    assert doc["request_counts"] == {"total": LINES, "completed": 0, "failed": LINES}
    assert restarted.store.get(labels_name(batch_id)) is None  # dropped with the chunks


class SteppedClock:
    """``time.time`` for the feeder's intake: it moves only when a test moves it."""

    def __init__(self) -> None:
        self.now_s = time.time()

    def time(self) -> float:
        return self.now_s


@pytest.mark.parametrize("bad_lines", [False, True])
def test_a_cancel_during_validation_ends_the_batch_no_earlier_than_it_was_asked(
        bad_lines: bool, feeder_settings: Settings, client: redis.Redis, keys: Keys,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The file takes seconds to parse, and the cancel comes meanwhile: ``cancelled_at``
    is not before ``cancelling_at`` (it was the time the parse began)."""
    clock = SteppedClock()
    monkeypatch.setattr(intake, "time", clock)
    feeder = new_feeder(feeder_settings, client, keys)
    batch_id = add_batch(feeder.db, feeder.store, "slow",
                         b"not json\n" if bad_lines else None)
    real_parse = intake.parse_file

    def slow_parse(*args: Any) -> Any:
        clock.now_s += 5.0  # a large file
        assert feeder.db.move(batch_id, (BulkStatus.VALIDATING,), BulkStatus.CANCELLING,
                              cancelling_at=int(clock.now_s))
        return real_parse(*args)

    monkeypatch.setattr(intake, "parse_file", slow_parse)
    feeder.step()
    doc = document(feeder.db, batch_id)
    assert doc["status"] == "cancelled"
    assert doc["cancelled_at"] >= doc["cancelling_at"]


class NoListBucket(LocalFileStore):
    """A store as S3 answers credentials without ``s3:ListBucket``: a GET of an object
    that is not there is refused (403), not answered 404."""

    def get(self, name: str) -> bytes | None:
        data = super().get(name)
        if data is None:
            raise BackendUnavailable(f"file store (S3): AccessDenied reading {name}")
        return data


def test_a_batch_ends_on_a_store_that_refuses_reads_of_missing_objects(
        feeder_settings: Settings, client: redis.Redis, keys: Keys) -> None:
    """Least-privilege S3 credentials (Get/Put/DeleteObject, no ListBucket): finalizing
    never reads an object that may not exist yet, so the batch still ends."""
    feeder = Feeder(feeder_settings, Queue(client, keys), BulkDb(client, keys),
                    NoListBucket(feeder_settings.bulk.files_dir))
    batch_id = add_batch(feeder.db, feeder.store, "least-privilege")
    feeder.step()  # validated
    assert feeder.db.move(batch_id, (BulkStatus.IN_PROGRESS,), BulkStatus.CANCELLING,
                          cancelling_at=int(time.time()))
    for _ in range(5):
        if document(feeder.db, batch_id)["status"] == "cancelled":
            break
        feeder.step()
    doc = document(feeder.db, batch_id)
    assert doc["status"] == "cancelled" and doc["request_counts"]["failed"] == LINES
    assert doc["error_file_id"] is not None and doc["output_file_id"] is None
