"""The webhook settings: where deliveries may go, how they are retried, how signed.

Read by ``carpool.core.settings.load_settings`` (the one function that reads the
environment) through ``read_webhook_settings``; every field has its row in
docs/reference.md.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field

from carpool.core.errors import ConfigError

#: What a secret looks like: Standard Webhooks' "whsec_" and base64 of its bytes.
SECRET_PREFIX = "whsec_"
#: A shorter secret is guessable offline from one signed delivery.
MIN_SECRET_BYTES = 24
#: A lease outlasts its try's deadline by this much: the bodies' read before the try
#: and the settle after it, with room for a slow Redis.
LEASE_MARGIN_MS = 5000
#: The highest TCP port (0 turns a metrics endpoint off).
MAX_PORT = 65535


@dataclass(frozen=True)
class WebhookSettings:
    """How the web judges webhook URLs and how the dispatcher delivers them."""

    #: Let webhooks go to loopback, private, link-local and reserved addresses (never
    #: to cloud metadata ones): for receivers inside the operator's network, and tests.
    allow_private: bool = False
    #: The deployment's signing secret (whsec_...), for jobs of keys without their own.
    secret: str = ""
    #: Per API key digest: that key's own secret.
    key_secrets: Mapping[str, str] = field(default_factory=dict)
    #: The first retry waits about this long; each next one twice as long, with jitter.
    retry_base_s: float = 5.0
    #: No wait between tries is longer (a receiver's Retry-After included).
    retry_max_s: float = 3600.0
    #: An event not delivered this long after it happened is dead-lettered.
    max_age_s: float = 86400.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    #: Deliveries one dispatcher has in flight at once.
    concurrency: int = 16
    #: Port of a dispatcher's Prometheus endpoint; 0 turns it off.
    metrics_port: int = 9300

    @property
    def try_s(self) -> float:
        """The deadline of one whole try, DNS, connect, TLS, request and answer together
        (dispatcher/delivery.py cuts it there)."""
        return self.connect_timeout_s + self.read_timeout_s

    @property
    def lease_ms(self) -> int:
        """How long a taken event is a dispatcher's before another may take it: one
        whole try and a margin (for reading the bodies and the settle), so a live
        dispatcher never loses it."""
        return int(self.try_s * 1000) + LEASE_MARGIN_MS

    def secret_for(self, owner: str) -> str:
        """The secret that signs a job of ``owner`` (an API key digest; "" none)."""
        return self.key_secrets.get(owner, self.secret)


def check_secret(secret: str, where: str) -> str:
    """``secret`` if it is a usable Standard Webhooks secret; raises ``ConfigError``."""
    body = secret.removeprefix(SECRET_PREFIX).rstrip("=")
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not secret.startswith(SECRET_PREFIX) or len(raw) < MIN_SECRET_BYTES:
        raise ConfigError(f"{where}: a webhook secret is 'whsec_' and base64 of at least "
                          f"{MIN_SECRET_BYTES} random bytes; make one with: python -c "
                          "\"import base64,os;print('whsec_'+base64.b64encode("
                          "os.urandom(32)).decode())\"")
    return secret


def read_webhook_settings(env: Mapping[str, str], key_secrets: Mapping[str, str]
                          ) -> WebhookSettings:
    secret = env.get("CARPOOL_WEBHOOK_SECRET", "")
    if secret:
        check_secret(secret, "CARPOOL_WEBHOOK_SECRET")
    s = WebhookSettings(
        allow_private=_flag(env, "CARPOOL_WEBHOOK_ALLOW_PRIVATE"),
        secret=secret, key_secrets=dict(key_secrets),
        retry_base_s=_seconds(env, "CARPOOL_WEBHOOK_RETRY_BASE_S", 5.0),
        retry_max_s=_seconds(env, "CARPOOL_WEBHOOK_RETRY_MAX_S", 3600.0),
        max_age_s=_seconds(env, "CARPOOL_WEBHOOK_MAX_AGE_S", 86400.0),
        connect_timeout_s=_seconds(env, "CARPOOL_WEBHOOK_CONNECT_TIMEOUT_S", 5.0),
        read_timeout_s=_seconds(env, "CARPOOL_WEBHOOK_READ_TIMEOUT_S", 10.0),
        concurrency=_int(env, "CARPOOL_DISPATCH_CONCURRENCY", 16, 1),
        metrics_port=_int(env, "CARPOOL_DISPATCH_METRICS_PORT", 9300, 0, MAX_PORT),
    )
    if s.retry_base_s > s.retry_max_s:
        raise ConfigError(f"CARPOOL_WEBHOOK_RETRY_BASE_S ({s.retry_base_s:g}) is above "
                          f"CARPOOL_WEBHOOK_RETRY_MAX_S ({s.retry_max_s:g})")
    return s


def _int(env: Mapping[str, str], name: str, default: int, minimum: int,
         maximum: int | None = None) -> int:
    """A whole number in [minimum, maximum]: 0.5 threads was 0, and port 70000 failed
    only at bind (the other ports are refused at start: carpool/core/settings.py)."""
    raw = env.get(name, "")
    if not raw:
        return default
    value = int(raw) if raw.isascii() and raw.isdigit() else -1
    if value < minimum or (maximum is not None and value > maximum):
        raise ConfigError(f"{name}={raw[:40]!r}: give a whole number from {minimum}"
                          + (f" to {maximum}" if maximum is not None else ""))
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    """0 or 1, as every flag (carpool/core/settings.py): "true" was read as 0."""
    raw = env.get(name, "")
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{name}={raw[:40]!r} must be 0 or 1")
    return raw == "1"


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"{name}={raw[:40]!r}: give a positive number")
    return value
