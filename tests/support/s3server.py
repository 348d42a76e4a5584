"""A real S3 API server for tests: moto's, in its own process on a free port."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import answers, free_port, running

#: What boto3 needs to sign requests; moto accepts any.
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
          "AWS_DEFAULT_REGION": "us-east-1"}


#: moto_server's switch that checks credentials after this many requests (its first,
#: the bucket's creation, goes unchecked): any key then answers 403, as a wrong one does.
CHECK_CREDENTIALS = {"INITIAL_NO_AUTH_ACTION_COUNT": "1"}


@contextmanager
def moto_s3(bucket: str, server_env: Mapping[str, str] | None = None) -> Iterator[str]:
    """moto_server with ``bucket`` made; yields its endpoint URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    program = str(Path(sys.executable).parent / "moto_server")
    with running([program, "-H", "127.0.0.1", "-p", str(port)], {**S3_ENV, **(server_env or {})},
                 lambda: answers(f"{url}/moto-api/"), "moto_server", 30.0):
        import boto3

        boto3.client("s3", endpoint_url=url, **_creds()).create_bucket(Bucket=bucket)
        yield url


def _creds() -> dict[str, str]:
    return {"aws_access_key_id": "test", "aws_secret_access_key": "test",
            "region_name": "us-east-1"}


def s3_client(url: str) -> object:
    import boto3

    return boto3.client("s3", endpoint_url=url, **_creds())
