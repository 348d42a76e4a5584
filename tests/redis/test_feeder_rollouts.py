"""The feeder and a retiring version, on a real Redis and a folder store, stepped by
hand: a bulk batch pinned to a version that retires admits none of its remaining
lines; each ends in the error file as ``model_unavailable``, as for a refused model."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from carpool.backend.filestore import store_name
from carpool.backend.keys import Keys
from carpool.backend.rollouts import RolloutStore
from carpool.core.rollouts import change
from carpool.core.settings import load_settings
from tests.conftest import make_env
from tests.redis.test_feeder_input import LINES, add_batch, document, new_feeder
from tests.support.bulk import CATALOGUE_TOML, FINAL, embedding_lines

#: Steps a batch of refused lines takes to end, with room to spare.
STEPS = 10
VERSION_2 = """
[models.hemb.versions.2]
result_ttl_s = 600
"""


def test_a_batch_pinned_to_a_retiring_version_admits_no_more_lines(
        tmp_path: Path, redis_url: str, key_prefix: str, client: redis.Redis,
        keys: Keys) -> None:
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML + VERSION_2)
    settings = load_settings(make_env(redis_url, key_prefix,
                                      CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                                      CARPOOL_FILES_DIR=str(tmp_path / "files")))
    feeder = new_feeder(settings, client, keys)
    batch_id = add_batch(feeder.db, feeder.store, "file-v2",
                         embedding_lines(LINES, model="hemb@2"))
    RolloutStore(client, keys).update("hemb", lambda current, now_ms: change(
        current, {"retire": "2"}, ["1", "2"], "1", now_ms))
    for _ in range(STEPS):  # validate, feed (refused), store, finish
        feeder.step()
        doc = document(feeder.db, batch_id)
        if doc["status"] in FINAL:
            break
    assert doc["status"] == "completed"
    assert client.zcard(keys.bin("hemb@2", "short")) == 0  # nothing admitted
    assert doc["request_counts"] == {"total": LINES, "completed": 0, "failed": LINES}
    stored = feeder.store.get(store_name(doc["error_file_id"]))
    assert stored is not None
    errors = [json.loads(line) for line in stored.decode().splitlines()]
    assert {e["error"]["code"] for e in errors} == {"model_unavailable"}
    assert "is retiring" in errors[0]["error"]["message"]
