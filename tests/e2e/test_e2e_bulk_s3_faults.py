"""Files and batches while their S3 store fails: a real moto server behind a proxy that
is switched off (every connection reset) and on again, or a feeder killed at a chosen
point; the real web, worker and feeder, and the openai SDK."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from carpool.stack.waiting import wait_until
from tests.conftest import REDIS_URL, make_env
from tests.support.bulk import (
    CATALOGUE_TOML,
    FINAL,
    embedding_lines,
    feeder_command,
    lines_of,
    start_feeder,
    wait_batch,
)
from tests.support.feeder_held import HELD
from tests.support.procs import log_says, start_web, start_worker
from tests.support.s3server import CHECK_CREDENTIALS, S3_ENV, moto_s3, s3_client
from tests.support.switch import Switch, switch

pytestmark = pytest.mark.e2e

BUCKET = "faults"


@contextmanager
def web_on_s3(tmp_path: Path, env_out: dict[str, str] | None = None
              ) -> Iterator[tuple[openai.OpenAI, Switch, str]]:
    """The SDK (no retries: each answer is the web's own), the switch in front of S3,
    and S3's own address (behind no switch); ``env_out`` gets the processes' env."""
    (tmp_path / "catalogue.toml").write_text(CATALOGUE_TOML)
    with moto_s3(BUCKET) as url, switch(int(url.rsplit(":", 1)[1])) as s3:
        env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}",
                       CARPOOL_CONFIG=str(tmp_path / "catalogue.toml"),
                       CARPOOL_FILES_S3_BUCKET=BUCKET, CARPOOL_SYNTHETIC_COST_MS="1,0.01",
                       CARPOOL_FILES_S3_ENDPOINT_URL=f"http://127.0.0.1:{s3.port}", **S3_ENV)
        if env_out is not None:
            env_out.update(env)
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


def test_a_feeder_killed_just_after_a_batch_ended_leaves_no_chunk_in_the_bucket(
        tmp_path: Path) -> None:
    """The feeder is held as the batch turns final (tests/support/feeder_held.py) and
    killed there: its chunks and labels must be gone already, as no step comes back to
    a final batch (they were dropped after the end, and stayed in the bucket for good)."""
    env: dict[str, str] = {}
    lines = 300
    with web_on_s3(tmp_path, env) as (client, _, url), \
            start_worker({**env, "CARPOOL_MODELS": "hemb"}), \
            start_feeder(env, tmp_path / "held.log", held_at="ended:1") as held:
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(embedding_lines(lines))),
                                      purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                      completion_window="24h")
        wait_until(lambda: log_says(tmp_path / "held.log", f"{HELD} ended:1"), 60,
                   "the feeder held as the batch ended")
        held.send_signal(signal.SIGKILL)
        assert held.wait(timeout=30) == -signal.SIGKILL
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed", done
        ids = [line["custom_id"] for line in lines_of(client, done.output_file_id)]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(lines))
        listed = s3_client(url).list_objects_v2(Bucket=BUCKET)  # type: ignore[attr-defined]
        left = [o["Key"] for o in listed.get("Contents", []) if "/batches/" in o["Key"]]
        assert left == []


#: How long a feeder that should refuse to start gets to exit.
EXIT_TIMEOUT_S = 30.0


@pytest.mark.parametrize(("bucket", "server_env", "says"), [
    ("nobucket", {}, "CARPOOL_FILES_S3_BUCKET='nobucket': no such bucket at "
                     "CARPOOL_FILES_S3_ENDPOINT_URL="),
    (BUCKET, CHECK_CREDENTIALS, "refuses these credentials (InvalidAccessKeyId): check "
                                "AWS_ACCESS_KEY_ID"),
])
def test_a_feeder_on_a_missing_bucket_or_refused_credentials_exits_naming_the_setting(
        bucket: str, server_env: dict[str, str], says: str) -> None:
    """It said "feeder ready", and every batch then stayed ``validating``."""
    with moto_s3(BUCKET, server_env) as url:
        env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}",
                       CARPOOL_FILES_S3_BUCKET=bucket, CARPOOL_FILES_S3_ENDPOINT_URL=url,
                       CARPOOL_FEEDER_METRICS_PORT="0", **S3_ENV)
        done = subprocess.run(feeder_command(), env={**os.environ, **env},
                              capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)
    assert done.returncode == 2, done.stderr[-2000:]
    assert says in done.stderr


def least_privilege_keys(url: str) -> dict[str, str]:
    """An IAM user's keys that may get, put and delete the bucket's objects, and no
    more (no s3:ListBucket): the policy a careful operator gives carpool."""
    import boto3

    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                       aws_access_key_id="test", aws_secret_access_key="test")
    iam.create_user(UserName="carpool")
    iam.put_user_policy(UserName="carpool", PolicyName="objects", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Resource": f"arn:aws:s3:::{BUCKET}/*",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]}]}))
    key = iam.create_access_key(UserName="carpool")["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def test_a_feeder_with_object_only_credentials_starts(tmp_path: Path) -> None:
    """HEAD of the bucket needs s3:ListBucket, which carpool does not: a 403 to it is
    no reason to refuse a start (it exited 2)."""
    # The bucket and three IAM calls are made before moto checks credentials.
    with moto_s3(BUCKET, {"INITIAL_NO_AUTH_ACTION_COUNT": "4"}) as url:
        env = make_env(REDIS_URL, f"test-{uuid.uuid4().hex[:12]}",
                       CARPOOL_FILES_S3_BUCKET=BUCKET, CARPOOL_FILES_S3_ENDPOINT_URL=url,
                       **{**S3_ENV, **least_privilege_keys(url)})
        with start_feeder(env, tmp_path / "feeder.log"):
            assert log_says(tmp_path / "feeder.log", "HEAD of the bucket was refused")


def test_a_feeder_starts_while_s3_is_down_and_runs_a_batch_once_it_is_back(
        tmp_path: Path) -> None:
    """Unreachable is not misconfigured: the store may come back, and each step retries."""
    env: dict[str, str] = {}
    with web_on_s3(tmp_path, env) as (client, s3, _), \
            start_worker({**env, "CARPOOL_MODELS": "hemb"}):
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(embedding_lines(20))),
                                      purpose="batch").id
        s3.off()
        with start_feeder(env, tmp_path / "feeder.log"):
            assert log_says(tmp_path / "feeder.log", "starting all the same")
            batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                          completion_window="24h")
            s3.turn_on()
            done = wait_batch(client, batch.id, FINAL, timeout_s=60)
            assert done.status == "completed", done
