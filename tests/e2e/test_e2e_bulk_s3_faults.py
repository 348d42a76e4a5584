"""The Files API while its S3 store fails: a real moto server behind a proxy that is
switched off (every connection reset) and on again, the real web and the openai SDK."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from tests.conftest import REDIS_URL, make_env
from tests.support.bulk import CATALOGUE_TOML, embedding_lines
from tests.support.procs import start_web
from tests.support.s3server import S3_ENV, moto_s3, s3_client
from tests.support.switch import Switch, switch

pytestmark = pytest.mark.e2e

BUCKET = "faults"


@contextmanager
def web_on_s3(tmp_path: Path) -> Iterator[tuple[openai.OpenAI, Switch, str]]:
    """The SDK (no retries: each answer is the web's own), the switch in front of S3,
    and S3's own address (behind no switch)."""
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    with moto_s3(BUCKET) as url, switch(int(url.rsplit(":", 1)[1])) as s3:
        env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}",
                       CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                       CARPOOL_FILES_S3_BUCKET=BUCKET,
                       CARPOOL_FILES_S3_ENDPOINT_URL=f"http://127.0.0.1:{s3.port}", **S3_ENV)
        with start_web(env) as base_url, openai.OpenAI(
                base_url=f"{base_url}/v1", api_key="-", max_retries=0) as client:
            yield client, s3, url


def test_a_download_while_s3_is_down_answers_503_and_one_of_a_lost_object_404(
        tmp_path: Path) -> None:
    with web_on_s3(tmp_path) as (client, s3, url):
        data = embedding_lines(3)
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
        assert client.files.content(file_id).content == data
        s3.off()
        with pytest.raises(openai.InternalServerError) as down:
            client.files.content(file_id)
        assert down.value.status_code == 503  # was gunicorn's 500 page: the stream broke
        assert "file store" in str(down.value.body)
        s3.turn_on()
        assert client.files.content(file_id).content == data
        s3_client(url).delete_object(  # type: ignore[attr-defined]
            Bucket=BUCKET, Key=f"carpool/files/{file_id}")
        with pytest.raises(openai.NotFoundError, match="file store"):  # was 200, empty
            client.files.content(file_id)


def test_a_delete_while_s3_is_down_keeps_the_file_until_a_retry_deletes_its_bytes(
        tmp_path: Path) -> None:
    with web_on_s3(tmp_path) as (client, s3, url):
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(embedding_lines(3))),
                                      purpose="batch").id
        s3.off()
        with pytest.raises(openai.InternalServerError) as down:
            client.files.delete(file_id)
        assert down.value.status_code == 503
        s3.turn_on()
        # Not half-deleted: the record stayed (was: gone, so the retry answered 404
        # and the bytes stayed in the bucket for good).
        assert client.files.retrieve(file_id).id == file_id
        assert client.files.delete(file_id).deleted
        listed = s3_client(url).list_objects_v2(Bucket=BUCKET)  # type: ignore[attr-defined]
        assert [o["Key"] for o in listed.get("Contents", [])] == []
