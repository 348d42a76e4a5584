"""The file store on S3 (a real moto server): the store's contract, then a batch end
to end with its input, chunks and outputs in the bucket."""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path

import openai
import pytest

from carpool.backend.filestore import STREAM_CHUNK_BYTES, S3FileStore
from tests.conftest import REDIS_URL, make_env
from tests.support.bulk import (
    CATALOGUE_TOML,
    embedding_lines,
    lines_of,
    start_feeder,
    wait_batch,
)
from tests.support.procs import start_web, start_worker
from tests.support.s3server import S3_ENV, moto_s3, s3_client

pytestmark = pytest.mark.e2e


def test_s3_store_puts_replaces_streams_and_deletes_objects() -> None:
    with moto_s3("store") as url:
        store = S3FileStore("store", "p/", client=s3_client(url))
        assert store.get("files/a") is None and list(store.stream("files/a")) == []
        assert not store.exists("files/a")
        store.put("files/a", b"one")
        assert store.exists("files/a")
        store.put("files/a", b"two")  # replaced whole
        assert store.get("files/a") == b"two"
        big = os.urandom(STREAM_CHUNK_BYTES + 10)
        store.put("files/big", big)
        assert b"".join(store.stream("files/big")) == big
        store.delete("files/a")
        store.delete("files/a")  # gone already: no error
        assert store.get("files/a") is None and not store.exists("files/a")
        with pytest.raises(ValueError, match="not a store name"):
            store.put("../x", b"")


def test_a_batch_runs_with_its_files_in_s3(tmp_path: Path) -> None:
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    with moto_s3("batches") as url:
        env = make_env(REDIS_URL, prefix, CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                       CARPOOL_FILES_S3_BUCKET="batches", CARPOOL_FILES_S3_ENDPOINT_URL=url,
                       CARPOOL_SYNTHETIC_COST_MS="1,0.01", **S3_ENV)
        with start_web(env) as base_url, start_worker({**env, "CARPOOL_MODELS": "hemb"}), \
                start_feeder(env, tmp_path / "feeder.log"), \
                openai.OpenAI(base_url=f"{base_url}/v1", api_key="-") as client:
            file_id = client.files.create(file=("in.jsonl", io.BytesIO(embedding_lines(500))),
                                          purpose="batch").id
            batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                          completion_window="24h")
            done = wait_batch(client, batch.id, {"completed", "failed"}, timeout_s=60)
            assert done.status == "completed", done
            ids = [line["custom_id"] for line in lines_of(client, done.output_file_id)]
            assert sorted(ids) == sorted(f"req-{i}" for i in range(500))
            listed = s3_client(url).list_objects_v2(Bucket="batches")  # type: ignore[attr-defined]
            names = {o["Key"] for o in listed.get("Contents", [])}
            assert f"carpool/files/{file_id}" in names
            assert f"carpool/files/{done.output_file_id}" in names
            assert not any("/out-" in n for n in names)  # chunks dropped once assembled
