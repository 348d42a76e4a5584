"""API keys: ``CARPOOL_API_KEYS`` (comma-separated) and ``CARPOOL_API_KEYS_FILE`` (one
key a line, ``#`` comments), each key followed by its options:

    <key> weight=2 webhook_secret=whsec_... admin quota_device_s_per_hour=60 quota_jobs_per_s=5

- ``weight=N``: its fair share (docs/admission.md); ``webhook_secret``: signing;
- ``admin``: ``GET /usage`` shows every key's usage, not only its own; only an admin
  key loads and unloads models (/v2/repository);
- ``tier=priority|default|flex``: its service tier (carpool/admission/tiers.py);
- ``quota_device_s_per_hour=X``: device seconds its jobs may use per hour and model;
  ``quota_jobs_per_s=Y``: jobs it may submit per second and model. Past either,
  admission answers 429 ``quota_exceeded`` (admit.lua; lua/lib/quota.lua).

A malformed entry stops start-up with a ``ConfigError`` naming its line.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from carpool.core.errors import ConfigError
from carpool.core.webhook_settings import check_secret

#: An API key shorter than this cannot hold 128 random bits in hex or base64.
MIN_API_KEY_CHARS = 22
#: What an API key entry may say after the key.
KEY_OPTIONS = ("weight", "webhook_secret", "admin", "quota_device_s_per_hour",
               "quota_jobs_per_s", "tier")
#: Service tiers, lowest first (carpool/admission/tiers.py).
KEY_TIERS = ("flex", "default", "priority")


def api_key_digest(key: str) -> str:
    """What carpool keeps of an API key (settings, and each job's owner): its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyPolicy:
    """What a key may see and spend; 0: no quota."""

    admin: bool = False
    quota_device_s_per_hour: float = 0.0
    quota_jobs_per_s: float = 0.0
    tier: str = "default"


@dataclass(frozen=True)
class ApiKeys:
    """The API keys' digests, and what some of them were given."""

    digests: frozenset[str]
    weights: dict[str, float]
    webhook_secrets: dict[str, str]
    policies: dict[str, KeyPolicy] = field(default_factory=dict)


def _entries(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(where, entry) of every key entry; ``where`` names the variable or file line."""
    entries = [("CARPOOL_API_KEYS", e.strip()) for e in env.get("CARPOOL_API_KEYS", "").split(",")]
    path = env.get("CARPOOL_API_KEYS_FILE")
    if path:
        try:  # utf-8-sig: an editor's BOM is not part of the first key
            lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
        except OSError as exc:
            raise ConfigError(f"CARPOOL_API_KEYS_FILE={path}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"CARPOOL_API_KEYS_FILE={path}: not UTF-8 (byte {exc.start + 1})"
                              ) from None
        entries += [(f"CARPOOL_API_KEYS_FILE={path} line {n}", line.strip())
                    for n, line in enumerate(lines, 1)
                    if line.strip() and not line.lstrip().startswith("#")]
    return entries


def read_api_keys(env: Mapping[str, str]) -> ApiKeys:
    """Each key's digest, and the options of those given any."""
    out = ApiKeys(frozenset(), {}, {})
    digests = set()
    for where, entry in _entries(env):
        if not entry:
            continue
        key, *options = entry.split()
        if len(key) < MIN_API_KEY_CHARS or not key.isascii() or not key.isprintable():
            raise ConfigError(
                f"an API key ({key[:4]}...) is shorter than {MIN_API_KEY_CHARS} characters or "
                "not printable ASCII; make keys with `openssl rand -hex 16`")
        digest = api_key_digest(key)
        digests.add(digest)
        policy: dict[str, float | bool | str] = {}
        for option in options:
            name, _, value = option.partition("=")
            here = f"{where}: key {key[:4]}..."
            if name == "weight":
                out.weights[digest] = _positive(here, option)
            elif name == "webhook_secret":
                out.webhook_secrets[digest] = check_secret(value, here)
            elif name == "admin" and value in ("", "1", "true"):
                policy["admin"] = True
            elif name == "tier":
                if value not in KEY_TIERS:
                    raise ConfigError(f"{here}: tier must be one of {', '.join(KEY_TIERS)}, "
                                      f"not {value[:40]!r}")
                policy["tier"] = value
            elif name.startswith("quota_") and name in KEY_OPTIONS:
                policy[name] = _positive(here, option)
            else:
                raise ConfigError(f"{here}: unknown option {option[:40]!r}; allowed: "
                                  f"{', '.join(KEY_OPTIONS)}")
        if policy:
            out.policies[digest] = KeyPolicy(**policy)  # type: ignore[arg-type]
    if not digests and env.get("CARPOOL_API_KEYS_FILE"):
        # No key serves everyone without one: a file emptied to revoke every key must
        # not open the service instead.
        raise ConfigError(f"CARPOOL_API_KEYS_FILE={env['CARPOOL_API_KEYS_FILE']} holds no "
                          "key, which would serve every request without one; add a key, or "
                          "unset it to run without keys")
    return ApiKeys(frozenset(digests), out.weights, out.webhook_secrets, out.policies)


def _positive(where: str, text: str) -> float:
    name, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise ConfigError(f"{where}: write '{name}=N' with a number N > 0, "
                          f"not {text[:40]!r}")
    return number
