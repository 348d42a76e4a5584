"""A bulk batch's service tier, from ``POST /v1/batches`` to the feeder's admissions: the
web app and the real feeder stepped by hand on one real Redis and folder store. The
batches' lines (model ``texts``, bin ``short``: max_depth 100, max_batch 8) may take
2 full batches of the bin (16 lines); interactive jobs fill it first."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest
from carpool.backend.bulkdb import BulkDb, bulk_document, new_bulk_id
from carpool.backend.filestore import LocalFileStore, store_name
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.jobs import new_job_id
from carpool.core.settings import Settings
from feeder.feeder import Feeder
from tests.support.bulk import embedding_lines
from tests.support.webtools import web_client, web_settings

FLEX, PLAIN, PRIO = "f" * 30, "d" * 30, "p" * 30
#: Lines each batch brings: more than the feeder lets wait in the bin at once.
LINES = 40
#: What the feeder lets wait in ``short`` (CARPOOL_BATCH_QUEUED_PER_BIN 2 x max_batch 8).
FEED_ROOM = 16


@dataclass
class Setup:
    settings: Settings
    http: FlaskClient
    client: redis.Redis
    keys: Keys

    def feeder(self) -> Feeder:
        """A feeder process's state as it starts: nothing but what Redis holds."""
        return Feeder(self.settings, Queue(self.client, self.keys),
                      BulkDb(self.client, self.keys),
                      LocalFileStore(self.settings.bulk.files_dir))

    def batch(self, key: str, **body: Any) -> str:
        auth = {"Authorization": f"Bearer {key}"}
        fid = self.http.post("/v1/files", headers=auth, content_type="multipart/form-data",
                             data={"purpose": "batch", "file": (
                                 io.BytesIO(embedding_lines(LINES, model="texts")), "in.jsonl")}
                             ).get_json()["id"]
        made = self.http.post("/v1/batches", headers=auth, json={
            "input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h",
            **body})
        assert made.status_code == 200, made.get_json()
        return str(made.get_json()["id"])

    def fill(self, n: int) -> None:
        """``n`` interactive jobs (no key: default tier, no fair share) in ``short``."""
        spec = self.settings.catalogue.get("texts")
        jobs = tuple(AdmitJob(spec.bins[0], new_job_id("texts"), '"a"') for _ in range(n))
        outcomes = Admissions(self.client, self.keys).admit(AdmitRequest(spec, jobs, 600))
        assert len(outcomes) == n and all(hasattr(o, "id") for o in outcomes), outcomes

    def admitted(self, batch_id: str) -> int:
        return len(BulkDb(self.client, self.keys).line_state(batch_id)[0])

    def depth(self) -> int:
        return int(self.client.zcard(self.keys.bin("texts", "short")))

    def refused(self) -> dict[str, int]:
        models = self.http.get("/models").get_json()["models"]
        return dict(next(m for m in models if m["name"] == "texts")["refused_by_tier"])


@pytest.fixture
def setup(redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis,
          keys: Keys) -> Iterator[Setup]:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{FLEX} tier=flex\n{PLAIN}\n{PRIO} tier=priority\n")
    settings = web_settings(redis_url, key_prefix, tmp_path,
                            CARPOOL_FILES_DIR=str(tmp_path / "files"),
                            CARPOOL_API_KEYS_FILE=str(keys_file),
                            CARPOOL_BATCH_QUEUED_PER_BIN="2")
    with web_client(settings) as http:
        yield Setup(settings, http, client, keys)


def test_a_flex_batch_is_refused_under_flex_from_half_the_bin_while_a_default_one_is_fed(
        setup: Setup) -> None:
    setup.fill(45)  # flex may fill 50 of the bin's 100, default 80 (a priority key exists)
    flex = setup.batch(FLEX)  # its key's tier
    feeder = setup.feeder()
    feeder.step()  # validates it
    feeder.step()  # feeds it: 5 lines, the 6th refused
    assert (setup.admitted(flex), setup.depth()) == (50 - 45, 50)
    assert setup.refused() == {"priority": 0, "default": 0, "flex": 1}
    # A restarted feeder reads the tier from the batch's record: refused again.
    restarted = setup.feeder()
    restarted.step()
    assert setup.admitted(flex) == 5
    assert setup.refused() == {"priority": 0, "default": 0, "flex": 2}
    plain = setup.batch(PLAIN)
    restarted.step()  # validates it; the flex line refused once more
    restarted.step()  # feeds both, the keys taking turns
    # The flex line's refusal closes the bin to flex only: the default batch takes the
    # rest of the feeder's room in the same step, whichever key went first.
    assert (setup.admitted(flex), setup.admitted(plain)) == (5, FEED_ROOM - 5)
    assert setup.depth() == 45 + FEED_ROOM
    assert setup.refused() == {"priority": 0, "default": 0, "flex": 4}
    doc = setup.http.get(f"/v1/batches/{flex}",
                         headers={"Authorization": f"Bearer {FLEX}"}).get_json()
    assert (doc["status"], doc["service_tier"]) == ("in_progress", "flex")


def test_a_priority_keys_batch_is_fed_past_the_part_where_default_is_refused(
        setup: Setup) -> None:
    setup.fill(78)  # default may fill 80 of the bin's 100, priority all of it
    lowered = setup.batch(PRIO, service_tier="default")  # one key: no fair share between
    feeder = setup.feeder()
    feeder.step()
    feeder.step()
    assert (setup.admitted(lowered), setup.depth()) == (80 - 78, 80)
    assert setup.refused() == {"priority": 0, "default": 1, "flex": 0}
    own = setup.batch(PRIO)
    feeder.step()  # validates it; the default line refused once more
    assert setup.refused() == {"priority": 0, "default": 2, "flex": 0}
    feeder.step()  # feeds both: the priority batch takes the rest of the feeder's room
    assert (setup.admitted(lowered), setup.admitted(own)) == (2, FEED_ROOM - 2)
    assert setup.depth() == 78 + FEED_ROOM
    assert setup.refused()["priority"] == 0


@pytest.mark.parametrize("stored, status, tier", [
    (None, "in_progress", "default"),  # made before batches had a tier
    ("gold", "failed", "gold"),  # not one the web lets through
])
def test_a_batch_record_without_a_tier_runs_in_default_and_one_with_a_bad_tier_fails(
        setup: Setup, stored: str | None, status: str, tier: str) -> None:
    db = BulkDb(setup.client, setup.keys)
    LocalFileStore(setup.settings.bulk.files_dir).put(
        store_name("file-old"), embedding_lines(3, model="texts"))
    now, batch_id = int(time.time()), new_bulk_id()
    fields: dict[str, str | int] = {
        "id": batch_id, "owner": "", "endpoint": "/v1/embeddings",
        "input_file_id": "file-old", "completion_window": "24h", "window_s": 86400,
        "metadata": "", "created_at": now, "expires_at": now + 86400,
        "status": "validating", "total": 0, "completed": 0, "failed": 0, "chunks": 0,
        "webhook": ""}
    db.add_bulk(fields if stored is None else {**fields, "service_tier": stored}, 3600)
    feeder = setup.feeder()
    feeder.step()
    feeder.step()
    view = db.bulk(batch_id)
    assert view is not None
    doc = bulk_document(view)
    assert (doc["status"], doc["service_tier"]) == (status, tier), doc["errors"]
    if stored is None:
        assert setup.admitted(batch_id) == 3
    else:
        assert "service_tier 'gold' is not one of" in doc["errors"]["data"][0]["message"]
