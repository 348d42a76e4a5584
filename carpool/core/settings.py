"""One typed, frozen settings object, read from the environment in one function."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from carpool.core.api_keys import MIN_API_KEY_CHARS as MIN_API_KEY_CHARS
from carpool.core.api_keys import KeyPolicy, read_api_keys
from carpool.core.api_keys import api_key_digest as api_key_digest
from carpool.core.bulk_settings import BulkSettings, load_bulk_settings
from carpool.core.catalogue import Catalogue, load_catalogue
from carpool.core.errors import ConfigError
from carpool.core.input_limits import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ITEMS, InputLimits
from carpool.core.webhook_settings import WebhookSettings, read_webhook_settings

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: Where Prometheus scrapes a worker (compose, Kubernetes and ops/prometheus agree).
DEFAULT_WORKER_METRICS_PORT = 9100
DEFAULT_WORKER_METRICS_ADDR = "0.0.0.0"
#: CARPOOL_QUEUED_TTL_S's default: a day.
QUEUED_TTL_S_DEFAULT = 24 * 3600
#: Renewal and reaping never run more often than this, whatever the lease.
MIN_LEASE_TICK_MS = 30


#: What ``CARPOOL_CALIBRATE`` may say: calibrate when no profile is cached (on a GPU
#: only), calibrate always, or never (warm-up only).
CALIBRATE_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class ExecutorSettings:
    """How a worker runs torch models; the synthetic model ignores all of it."""

    #: "auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N".
    device: str = "auto"
    #: Batches in flight: 2 = while batch N computes, batch N+1 is claimed and copied in.
    pipeline_depth: int = 2
    #: Threads that decode and resize inputs; Pillow and the tokenizer release the GIL.
    preprocess_threads: int = 2
    #: torch intra-op threads per worker process; 0 keeps torch's default (all cores).
    torch_threads: int = 1
    #: Free GPU memory (fraction of the total) below which a bin's batch limit halves.
    free_watermark: float = 0.10
    #: Run ``torch.cuda.empty_cache()`` every this many batches (0: never), between batches.
    empty_cache_every: int = 200
    #: Where calibration profiles (JSON, one per device + model + bins) are kept:
    #: always absolute, so the folder does not depend on where the worker started.
    profile_dir: Path = Path(tempfile.gettempdir()) / "carpool" / "profiles"
    calibrate: str = "auto"


@dataclass(frozen=True)
class Settings:
    """Everything a web or worker process needs to know, passed explicitly."""

    redis_url: str
    key_prefix: str
    #: CARPOOL_REDIS_CLUSTER=1: ``redis_url`` names any node of a Redis Cluster.
    redis_cluster: bool
    catalogue: Catalogue
    #: How long a claimed batch stays leased to one worker before others may retry it.
    lease_ms: int
    max_attempts: int
    #: Bound on a whole HTTP request body (Flask's MAX_CONTENT_LENGTH).
    max_body_bytes: int
    #: How deep a job's input may nest, and how long one of its arrays or objects may be.
    input_limits: InputLimits
    #: Longest ``?wait=`` a result long-poll may hold a connection.
    max_wait_s: float
    #: A job queued longer ends "expired" at its claim (its record has no TTL while
    #: queued); the idempotency key and the owners' fair-share state live this long.
    queued_ttl_s: int
    #: The synthetic model's cost per batch of n: a_ms + b_ms * n.
    synthetic_cost_ms: tuple[float, float]
    #: Models a worker serves; empty means every model in the catalogue.
    worker_models: tuple[str, ...]
    worker_name: str
    #: Port of a worker's Prometheus endpoint; 0 turns it off.
    worker_metrics_port: int
    #: Address it listens on: every interface by default (Prometheus scrapes it from
    #: another container); `carpool up` binds 127.0.0.1, as it does the web and Flower.
    worker_metrics_addr: str
    #: Claim one GPU by a lease in Redis before the models load (compose replicas).
    gpu_claim: bool
    #: A claimed GPU is freed this long after its worker stops renewing the lease.
    gpu_lease_ms: int
    #: GPU UUIDs to claim from instead of asking nvidia-smi (hosts without it, tests).
    gpu_devices: tuple[str, ...]
    #: How a worker runs torch models: device, pipeline, memory guard, calibration.
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    #: Renewal keeps a batch leased at most this long; then the lease lapses and the
    #: reaper retries the jobs elsewhere, so a hung forward pass cannot hold them forever.
    max_batch_ms: int = 600_000
    #: How long a warm shutdown (SIGTERM) waits for the batch in hand before it hands
    #: the batch's jobs back; below the orchestrator's grace period (compose, k8s: 60 s).
    stop_grace_s: float = 45.0
    #: A model that every live worker refused, with none serving it, this long: its
    #: queued jobs end "failed" (model_unavailable) instead of waiting out
    #: ``queued_ttl_s`` (carpool/backend/refused_models.py). Above the slowest worker's load
    #: time, so a worker still loading the model is waited for.
    refused_grace_s: float = 30.0
    #: The scaling rule's cold start for a model no live worker has measured yet
    #: (image pull, scheduling, model load: carpool/backend/need_gauges.py).
    cold_start_s: float = 60.0
    #: `carpool up --workers MIN..MAX` stops a worker only after the need stayed below the
    #: pool this long (carpool/stack/scaling.py says why).
    scale_hold_down_s: float = 30.0
    #: Refuse to start when Redis may lose or evict jobs (no AOF, an evicting policy).
    require_durable: bool = False
    #: SHA-256 hex digests of the API keys; empty: no keys, anyone may submit and read.
    api_key_digests: frozenset[str] = frozenset()
    #: Fair-share weight per key digest (``<key> weight=N`` in the keys file); default 1.
    api_key_weights: Mapping[str, float] = field(default_factory=dict)
    #: Admin flag and quotas per key digest, those given any (carpool/core/api_keys.py).
    api_key_policies: Mapping[str, KeyPolicy] = field(default_factory=dict)
    #: A request body must arrive within this many seconds, plus one second per
    #: ``body_min_rate_bytes_per_s`` bytes received; else 408 (web/common/bodies.py).
    body_timeout_s: float = 10.0
    body_min_rate_bytes_per_s: int = 32 << 10
    #: Long-polls one client (address, or API key when keys are on) may hold open in
    #: one web process at once; more answer 429 (web/results/polls.py).
    max_polls_per_client: int = 1000
    #: A submit that waited longer than this inside the web before it was handled
    #: (event-loop lag, or a proxy's X-Request-Start) answers 503 overloaded at once
    #: (web/common/shedding.py); 0: never shed.
    web_max_queue_ms: int = 300
    #: Webhooks: where they may go, retries, signing secrets (docs/webhooks.md).
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    #: When set, ``GET /metrics`` on the web needs ``Authorization: Bearer <token>``;
    #: "": open (queue depths and rejection counts are then public).
    metrics_token: str = ""
    #: TEST ONLY: the synthetic model kills its worker process on the input value
    #: "__crash__", to prove that a poison input cannot take the queue down.
    synthetic_poison: bool = False
    #: Workers leave early when waiting for a fuller batch does not pay
    #: (docs/scheduling.md); off: every bin is a fixed window of max_wait_ms.
    adaptive_batching: bool = True
    #: TEST ONLY: the synthetic model appends each batch's input values here, one
    #: JSON line per model call, so tests can see exactly what reached the model.
    synthetic_call_log: str = ""
    #: Bulk batches and the file store (carpool/core/bulk_settings.py).
    bulk: BulkSettings = field(default_factory=BulkSettings)

    @property
    def lease_tick_ms(self) -> int:
        """How often a worker renews its leases and reaps expired ones: a third of a lease."""
        return max(MIN_LEASE_TICK_MS, self.lease_ms // 3)


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    port = _int(env, name, default)
    if port > 65535:
        raise ConfigError(f"{name}={port} is not a TCP port (0 turns it off)")
    return port


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name, "")
    if raw == "":
        return default
    if raw not in ("0", "1"):
        raise ConfigError(f"{name}={raw!r} must be 0 or 1")
    return raw == "1"


def _redis_url(env: Mapping[str, str]) -> str:
    url = env.get("CARPOOL_REDIS_URL") or DEFAULT_REDIS_URL
    parsed = urlparse(url)
    # A misspelled URL must fail loudly, never fall back to localhost.
    if parsed.scheme not in REDIS_SCHEMES or not (parsed.hostname or parsed.path):
        raise ConfigError(
            f"CARPOOL_REDIS_URL={url!r} is not a Redis URL (redis://host:port/db, "
            "rediss://..., or unix:///path)"
        )
    return url


def _cost(env: Mapping[str, str]) -> tuple[float, float]:
    raw = env.get("CARPOOL_SYNTHETIC_COST_MS", "20,1")
    try:
        a_str, b_str = raw.split(",")
        a_ms, b_ms = float(a_str), float(b_str)
    except ValueError:
        raise ConfigError(
            f"CARPOOL_SYNTHETIC_COST_MS={raw!r} must be 'a,b' (ms per batch, ms per job)"
        ) from None
    if a_ms < 0 or b_ms < 0:
        raise ConfigError(f"CARPOOL_SYNTHETIC_COST_MS={raw!r} must not be negative")
    return a_ms, b_ms


def _fraction(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{name}={value} must be a fraction in [0, 1)")
    return value


def _profile_dir(env: Mapping[str, str]) -> Path:
    """``CARPOOL_PROFILE_DIR`` made absolute; by default the user's cache folder
    (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``carpool/profiles``), or the temp
    folder for a user without a home (a container's numeric user)."""
    raw = env.get("CARPOOL_PROFILE_DIR")
    if raw:
        return Path(raw).expanduser().absolute()
    cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if not os.path.isabs(cache):  # no HOME and no passwd entry: "~" stays unexpanded
        cache = tempfile.gettempdir()
    return Path(cache) / "carpool" / "profiles"


def _executor(env: Mapping[str, str]) -> ExecutorSettings:
    device = env.get("CARPOOL_DEVICE") or "auto"
    if device not in ("auto", "cpu", "cuda") and not (
            device.startswith("cuda:") and device[5:].isdigit()):
        raise ConfigError(f"CARPOOL_DEVICE={device!r}: use auto, cpu, cuda or cuda:N")
    calibrate = env.get("CARPOOL_CALIBRATE") or "auto"
    if calibrate not in CALIBRATE_MODES:
        raise ConfigError(f"CARPOOL_CALIBRATE={calibrate!r}: use one of {CALIBRATE_MODES}")
    return ExecutorSettings(
        device=device,
        pipeline_depth=_int(env, "CARPOOL_PIPELINE_DEPTH", 2, minimum=1),
        preprocess_threads=_int(env, "CARPOOL_PREPROCESS_THREADS", 2, minimum=1),
        torch_threads=_int(env, "CARPOOL_TORCH_THREADS", 1, minimum=0),
        free_watermark=_fraction(env, "CARPOOL_GPU_FREE_WATERMARK", 0.10),
        empty_cache_every=_int(env, "CARPOOL_EMPTY_CACHE_EVERY", 200, minimum=0),
        profile_dir=_profile_dir(env),
        calibrate=calibrate,
    )


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read every setting from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    config = env.get("CARPOOL_CONFIG")
    catalogue = load_catalogue(Path(config) if config else None)
    # An unknown name fails at start-up, not at the first job; "m@1" is "m" when m's own
    # entry is version 1 (carpool/core/versions.py).
    worker_models = tuple(catalogue.get(m).name
                          for m in env.get("CARPOOL_MODELS", "").split(",") if m)
    api_keys = read_api_keys(env)
    settings = Settings(
        redis_url=_redis_url(env),
        key_prefix=env.get("CARPOOL_KEY_PREFIX", "carpool"),
        redis_cluster=_flag(env, "CARPOOL_REDIS_CLUSTER"),
        catalogue=catalogue,
        lease_ms=_int(env, "CARPOOL_LEASE_MS", 30_000, minimum=100),
        max_attempts=_int(env, "CARPOOL_MAX_ATTEMPTS", 3, minimum=1),
        max_body_bytes=_int(env, "CARPOOL_MAX_BODY_BYTES", 16 << 20, minimum=1024),
        input_limits=InputLimits(
            _int(env, "CARPOOL_MAX_INPUT_DEPTH", DEFAULT_MAX_DEPTH, minimum=1),
            _int(env, "CARPOOL_MAX_INPUT_ITEMS", DEFAULT_MAX_ITEMS, minimum=1)),
        max_wait_s=float(_int(env, "CARPOOL_MAX_WAIT_S", 60, minimum=0)),
        queued_ttl_s=_int(env, "CARPOOL_QUEUED_TTL_S", QUEUED_TTL_S_DEFAULT, minimum=1),
        synthetic_cost_ms=_cost(env),
        worker_models=worker_models,
        worker_name=env.get("CARPOOL_WORKER_NAME", ""),
        worker_metrics_port=_port(env, "CARPOOL_WORKER_METRICS_PORT", DEFAULT_WORKER_METRICS_PORT),
        worker_metrics_addr=env.get("CARPOOL_WORKER_METRICS_ADDR") or DEFAULT_WORKER_METRICS_ADDR,
        gpu_claim=_flag(env, "CARPOOL_GPU_CLAIM"),
        gpu_lease_ms=_int(env, "CARPOOL_GPU_LEASE_MS", 30_000, minimum=100),
        gpu_devices=tuple(d for d in env.get("CARPOOL_GPU_DEVICES", "").split(",") if d),
        executor=_executor(env),
        max_batch_ms=_int(env, "CARPOOL_MAX_BATCH_MS", 600_000, minimum=1),
        stop_grace_s=float(_int(env, "CARPOOL_STOP_GRACE_S", 45, minimum=0)),
        refused_grace_s=float(_int(env, "CARPOOL_REFUSED_GRACE_S", 30, minimum=0)),
        cold_start_s=float(_int(env, "CARPOOL_COLD_START_S", 60, minimum=0)),
        scale_hold_down_s=float(_int(env, "CARPOOL_SCALE_HOLD_DOWN_S", 30, minimum=0)),
        require_durable=_flag(env, "CARPOOL_REQUIRE_DURABLE"),
        api_key_digests=api_keys.digests,
        api_key_weights=api_keys.weights,
        api_key_policies=api_keys.policies,
        webhooks=read_webhook_settings(env, api_keys.webhook_secrets),
        metrics_token=env.get("CARPOOL_METRICS_TOKEN", ""),
        body_timeout_s=float(_int(env, "CARPOOL_BODY_TIMEOUT_S", 10, minimum=1)),
        body_min_rate_bytes_per_s=_int(env, "CARPOOL_BODY_MIN_RATE", 32 << 10, minimum=1),
        max_polls_per_client=_int(env, "CARPOOL_MAX_POLLS_PER_CLIENT", 1000, minimum=1),
        web_max_queue_ms=_int(env, "CARPOOL_WEB_MAX_QUEUE_MS", 300),
        synthetic_poison=_flag(env, "CARPOOL_SYNTHETIC_POISON"),
        adaptive_batching=_flag(env, "CARPOOL_ADAPTIVE_BATCHING", True),
        synthetic_call_log=env.get("CARPOOL_SYNTHETIC_CALL_LOG", ""),
        bulk=load_bulk_settings(env),
    )
    check_consistency(settings)
    return settings


def check_consistency(s: Settings) -> None:
    """Refuse settings that contradict each other, naming both."""
    for spec in s.catalogue:
        for b in spec.bins:
            if b.max_wait_ms >= s.lease_ms:
                raise ConfigError(
                    f"model {spec.name!r} bin {b.name!r}: max_wait_ms ({b.max_wait_ms}) "
                    f"must be below CARPOOL_LEASE_MS ({s.lease_ms})"
                )
        if spec.max_input_bytes > s.max_body_bytes:
            raise ConfigError(
                f"model {spec.name!r}: max_input_bytes ({spec.max_input_bytes}) exceeds "
                f"CARPOOL_MAX_BODY_BYTES ({s.max_body_bytes}); such inputs could never arrive"
            )
    if s.max_batch_ms < s.lease_ms:
        raise ConfigError(
            f"CARPOOL_MAX_BATCH_MS ({s.max_batch_ms}) must be at least CARPOOL_LEASE_MS "
            f"({s.lease_ms}); renewal could never keep a batch leased"
        )
    if s.gpu_devices and not s.gpu_claim:
        raise ConfigError(
            "CARPOOL_GPU_DEVICES lists GPUs to claim, but CARPOOL_GPU_CLAIM is not 1: "
            "set CARPOOL_GPU_CLAIM=1 or drop the list"
        )
