"""Where files live: batch inputs, outputs and their chunks. Never in Redis.

One small interface, ``FileStore``, and two stores: a local folder (the default;
``.carpool/files`` under ``carpool up``) and S3-compatible object storage
(``CARPOOL_FILES_S3_BUCKET``; boto3, imported only then). Names are relative
paths such as ``files/file-abc`` or ``batches/batch_x/out-000003``; a ``put``
replaces the whole object at once, so a reader never sees half of one, and
writing the same name twice is how the feeder's writes stay idempotent.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from carpool.core.bulk_settings import BulkSettings
from carpool.core.errors import BackendUnavailable, ConfigError

log = logging.getLogger(__name__)

#: S3's codes for keys it does not take (unknown, a wrong secret, a stale token).
_REFUSED_KEYS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                 "ExpiredToken", "InvalidClientTokenId")
#: Bytes per piece when a file is streamed to a client.
STREAM_CHUNK_BYTES = 1 << 20


def store_name(file_id: str) -> str:
    """Where a file's bytes live in the file store."""
    return f"files/{file_id}"


class FileStore(Protocol):
    """Whole objects by name: put, get, exists, stream, delete."""

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name``, replacing any object of that name atomically."""

    def get(self, name: str) -> bytes | None:
        """The object's bytes; None when there is none."""

    def exists(self, name: str) -> bool:
        """Whether there is an object of that name (without reading it)."""

    def stream(self, name: str) -> Iterator[bytes]:
        """The object in pieces of at most STREAM_CHUNK_BYTES (empty when missing)."""

    def delete(self, name: str) -> None:
        """Remove the object; no error when it is already gone."""


def _checked(name: str) -> str:
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") for p in parts) or name.startswith("/"):
        raise ValueError(f"not a store name: {name[:80]!r}")
    return name


class LocalFileStore:
    """Objects as files under one folder; a put writes a temporary file and renames it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, name: str) -> Path:
        return self.root / _checked(name)

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the rename must not outlive the bytes in a crash
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def stream(self, name: str) -> Iterator[bytes]:
        try:
            f = self._path(name).open("rb")
        except FileNotFoundError:
            return
        with f:
            while piece := f.read(STREAM_CHUNK_BYTES):
                yield piece

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)


class S3FileStore:
    """Objects in one bucket of S3-compatible storage, under a key prefix."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str = "",
                 client: Any = None) -> None:
        if client is None:
            import boto3  # only deployments that store files in S3 need it

            client = boto3.client("s3", endpoint_url=endpoint_url or None)
        self.client, self.bucket, self.prefix = client, bucket, prefix
        self.endpoint_url = endpoint_url

    def _key(self, name: str) -> str:
        return self.prefix + _checked(name)

    def check(self) -> None:
        """At a start: ConfigError, naming the setting, when the bucket is missing or
        these credentials may not use it (no retry mends that); BackendUnavailable when
        the store does not answer (it may come back)."""
        from botocore.exceptions import ClientError, NoCredentialsError, ParamValidationError

        bucket = f"CARPOOL_FILES_S3_BUCKET={self.bucket!r}"
        try:
            with _s3_errors(ClientError, NoCredentialsError, ParamValidationError):
                self.client.head_bucket(Bucket=self.bucket)
        except (NoCredentialsError, ParamValidationError) as exc:
            raise ConfigError(f"{bucket}: {exc}") from None
        except ClientError as exc:  # HEAD answers bare status codes
            code = exc.response.get("Error", {}).get("Code")
            if code in ("404", "NoSuchBucket"):
                raise ConfigError(f"{bucket}: no such bucket at {self.where}") from None
            if code in ("403", "AccessDenied"):
                self._probe(bucket)  # HEAD needs s3:ListBucket, which carpool does not
                return
            raise BackendUnavailable(f"file store (S3): {exc}") from exc

    def _probe(self, bucket: str) -> None:
        """After a 403 to HEAD, a GET of an object that is not there tells refused keys
        (ConfigError) from a policy without s3:ListBucket, which is enough (a warning)."""
        from botocore.exceptions import ClientError

        try:
            with _s3_errors(ClientError):
                self.client.get_object(Bucket=self.bucket, Key=self._key("start-probe"))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in _REFUSED_KEYS:
                raise ConfigError(f"{bucket}: {self.where} refuses these credentials "
                                  f"({code}): check AWS_ACCESS_KEY_ID, "
                                  "AWS_SECRET_ACCESS_KEY (or the profile, the role)") from None
            if code in ("NoSuchBucket",):
                raise ConfigError(f"{bucket}: no such bucket at {self.where}") from None
            if code not in ("NoSuchKey", "404", "AccessDenied", "403"):
                raise BackendUnavailable(f"file store (S3): {exc}") from exc
        log.warning("%s: HEAD of the bucket was refused (no s3:ListBucket?): starting; "
                    "objects are read, written and deleted by name only", bucket)

    @property
    def where(self) -> str:
        """The store's address, as the settings name it."""
        url = self.endpoint_url
        return f"CARPOOL_FILES_S3_ENDPOINT_URL={url}" if url else "AWS"

    def put(self, name: str, data: bytes) -> None:
        with _s3_errors():
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def get(self, name: str) -> bytes | None:
        body = self._body(name)
        if body is None:
            return None
        with _s3_errors():
            data = bytes(body.read())
        return data

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            with _s3_errors(ClientError):
                self.client.head_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as exc:
            if _missing(exc):
                return False
            raise BackendUnavailable(f"file store (S3): {exc}") from exc
        return True

    def stream(self, name: str) -> Iterator[bytes]:
        body = self._body(name)
        if body is None:
            return
        with _s3_errors():
            yield from body.iter_chunks(STREAM_CHUNK_BYTES)

    def delete(self, name: str) -> None:
        with _s3_errors():
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def _body(self, name: str) -> Any:
        from botocore.exceptions import ClientError

        try:
            with _s3_errors(ClientError):
                return self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
        except ClientError as exc:
            if _missing(exc):
                return None
            raise BackendUnavailable(f"file store (S3): {exc}") from exc


def _missing(exc: Any) -> bool:
    """Whether a boto3 ClientError says the object is not there (HEAD answers a bare 404)."""
    return exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound")


class _s3_errors:  # noqa: N801 — used as a context manager, like contextlib's
    """Map boto3's errors to BackendUnavailable (503 on the web, back off in the feeder);
    ``passing`` are let through for the caller to read."""

    def __init__(self, *passing: type[BaseException]) -> None:
        self.passing = passing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc is None or isinstance(exc, self.passing):
            return
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, BotoCoreError | ClientError):
            raise BackendUnavailable(f"file store (S3): {exc}") from exc


def file_store(settings: BulkSettings) -> FileStore:
    """The store the settings name: S3 with a bucket, else the local folder."""
    if settings.s3_bucket:
        return S3FileStore(settings.s3_bucket, settings.s3_prefix, settings.s3_endpoint_url)
    return LocalFileStore(settings.files_dir)
