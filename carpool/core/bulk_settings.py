"""Settings of bulk batches (``/v1/files``, ``/v1/batches``) and of the file store.

Read once with the other settings (``carpool.core.settings.load_settings``); a
field of ``Settings.bulk``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from carpool.core.errors import ConfigError

#: OpenAI's limits on one batch input file.
MAX_BATCH_LINES_DEFAULT = 50_000
MAX_FILE_BYTES_DEFAULT = 200 << 20
#: Full batches of batch lines that may wait in one bin at once (the pacing of
#: docs/batches.md): enough that a worker never idles between two claims, few
#: enough that interactive jobs never find a bin filled with bulk work.
QUEUED_BATCHES_PER_BIN_DEFAULT = 2
#: The longest completion window a batch may ask for: OpenAI's only one, 24 h.
MAX_WINDOW_S = 24 * 3600


@dataclass(frozen=True)
class BulkSettings:
    #: Where files live: a local folder (the default) unless ``s3_bucket`` is set.
    files_dir: Path = Path(".carpool") / "files"
    #: S3-compatible object storage: bucket, endpoint (empty: AWS), key prefix.
    s3_bucket: str = ""
    s3_endpoint_url: str = ""
    s3_prefix: str = "carpool/"
    max_lines: int = MAX_BATCH_LINES_DEFAULT
    max_file_bytes: int = MAX_FILE_BYTES_DEFAULT
    queued_batches_per_bin: int = QUEUED_BATCHES_PER_BIN_DEFAULT
    #: How long a finished batch's document (and its files) is kept, in seconds.
    keep_s: int = 30 * 24 * 3600
    #: Port of the feeder's Prometheus endpoint; 0 turns it off (bound on
    #: CARPOOL_WORKER_METRICS_ADDR, as the dispatcher's is).
    metrics_port: int = 9400


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name) or ""
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def load_bulk_settings(env: Mapping[str, str]) -> BulkSettings:
    """``BulkSettings`` from the ``CARPOOL_FILES_*`` and ``CARPOOL_BATCH_*`` variables."""
    endpoint = env.get("CARPOOL_FILES_S3_ENDPOINT_URL", "")
    bucket = env.get("CARPOOL_FILES_S3_BUCKET", "")
    if endpoint and not bucket:
        raise ConfigError("CARPOOL_FILES_S3_ENDPOINT_URL is set but CARPOOL_FILES_S3_BUCKET "
                          "is not: name the bucket, or drop the endpoint")
    return BulkSettings(
        files_dir=Path(env.get("CARPOOL_FILES_DIR") or BulkSettings.files_dir).absolute(),
        s3_bucket=bucket, s3_endpoint_url=endpoint,
        s3_prefix=env.get("CARPOOL_FILES_S3_PREFIX", BulkSettings.s3_prefix),
        max_lines=_int(env, "CARPOOL_BATCH_MAX_LINES", MAX_BATCH_LINES_DEFAULT, 1),
        max_file_bytes=_int(env, "CARPOOL_BATCH_MAX_FILE_BYTES", MAX_FILE_BYTES_DEFAULT, 1024),
        queued_batches_per_bin=_int(env, "CARPOOL_BATCH_QUEUED_PER_BIN",
                                    QUEUED_BATCHES_PER_BIN_DEFAULT, 1),
        keep_s=_int(env, "CARPOOL_BATCH_KEEP_S", BulkSettings.keep_s, 60),
        metrics_port=_port(env, "CARPOOL_FEEDER_METRICS_PORT", BulkSettings.metrics_port),
    )


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    port = _int(env, name, default, 0)
    if port > 65535:
        raise ConfigError(f"{name}={port} is not a TCP port (0 turns it off)")
    return port
