"""``carpool batch``'s client (carpool/client/bulk.py) through a real TCP proxy in front
of real gunicorn that cuts its requests: an upload cut mid-body is sent again, a batch
create whose answer was lost is found, not made twice, and a download cut mid-answer is
read again whole."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from carpool.backend.connection import connect
from carpool.client.bulk import Bulk
from tests.conftest import REDIS_URL, make_env
from tests.support.cutproxy import Cut, CutProxy, cut_proxy
from tests.support.procs import start_web

#: Lines enough that a cut after a few KiB is mid-upload and mid-download.
LINES = 4000


@pytest.fixture
def proxy() -> Iterator[CutProxy]:
    env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}")
    with start_web(env) as base, cut_proxy(int(base.rsplit(":", 1)[1])) as p:
        yield p
    client = connect(REDIS_URL)
    keys = list(client.scan_iter(match="{" + env["CARPOOL_KEY_PREFIX"] + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_an_upload_and_a_create_cut_make_one_batch_and_a_cut_download_is_read_again(
        proxy: CutProxy, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("".join(json.dumps({"value": i, "size": 3}) + "\n"
                              for i in range(LINES)))
    upload = proxy.arm(Cut(b"POST /v1/files", request_bytes=4096))
    create = proxy.arm(Cut(b"POST /v1/batches", answer_bytes=0))  # made, its answer lost
    url = f"http://127.0.0.1:{proxy.port}"
    bulk = Bulk(url, None)
    try:
        doc = bulk.submit(inputs, "synthetic", "/submit", "24h")
        assert upload.used and create.used
        listed = httpx.get(f"{url}/v1/batches", params={"limit": 100}, timeout=10).json()
        assert [b["id"] for b in listed["data"]] == [doc["id"]]  # one batch, not two
        whole = httpx.get(f"{url}/v1/files/{doc['input_file_id']}/content", timeout=30).content
        download = proxy.arm(Cut(b"GET /v1/files/", answer_bytes=8192))
        assert bulk.content(doc["input_file_id"]) == whole
        assert download.used and len(whole) > 8192 * 4
    finally:
        bulk.close()
