"""What each API key's jobs cost, per model and hour: read back for ``GET /usage``.

complete.lua adds each batch's jobs, device time and queue time per owner into the
hour's hash ``{p.s}:usage:<model>:<hour>`` (``lua/lib/usage.lua``), admit.lua the jobs
it refused; the hashes live ``USAGE_KEEP_S``. A key is named by ``key_label``: the
first hex digits of its SHA-256 (``printf %s KEY | sha256sum``), never the key.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from carpool.backend.connection import redis_errors
from carpool.backend.keys import Keys

#: How long an hour's usage is kept: the widest window ``GET /usage`` answers.
USAGE_KEEP_HOURS = 7 * 24
USAGE_KEEP_S = USAGE_KEEP_HOURS * 3600
HOUR_MS = 3_600_000
#: The hex digits of a key's digest that name it in usage and metrics.
KEY_LABEL_CHARS = 12
#: The hash's field letters (lua/lib/usage.lua) and what each counts.
_FIELDS = {"j": "jobs", "d": "device_us", "q": "queue_ms", "r": "refused"}
#: The model's stats hash ({p.s}:mstats:<model>) counts its refusals per service tier
#: in fields "refused:<tier>" (lua/lib/usage.lua, usage_refused): never reset.
TIER_REFUSED_FIELD = "refused:"


def key_label(owner: str) -> str:
    """How usage names an owner digest ("" without keys: "anonymous")."""
    return owner[:KEY_LABEL_CHARS] if owner else "anonymous"


@dataclass
class UsageRow:
    """One key's usage of one model over a window of hours."""

    key: str
    model: str
    jobs: int = 0
    device_us: int = 0
    queue_ms: int = 0
    refused: int = 0

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "model": self.model, "jobs": self.jobs,
                "device_ms": self.device_us / 1000, "queue_ms": self.queue_ms,
                "refused": self.refused}


def read_usage(client: redis.Redis, keys: Keys, models: Sequence[str], first_hour: int,
               last_hour: int, owner: str | None) -> list[UsageRow]:
    """Sums per (key, model) over the hours ``first_hour..last_hour`` (hours since the
    epoch), of ``owner`` alone, or of every key when None; rows sorted by key, model."""
    hours = range(first_hour, last_hour + 1)
    with redis_errors():
        pipe = client.pipeline(transaction=False)
        for model in models:
            for hour in hours:
                pipe.hgetall(keys.usage(model, hour))
        found = pipe.execute()
    rows: dict[tuple[str, str], UsageRow] = {}
    for i, fields in enumerate(found):
        model = models[i // len(hours)]
        for name, value in fields.items():
            who, _, letter = str(name).rpartition(":")
            if letter not in _FIELDS or (owner is not None and who != owner):
                continue
            row = rows.setdefault((who, model), UsageRow(key_label(who), model))
            attr = _FIELDS[letter]
            setattr(row, attr, getattr(row, attr) + int(value))
    return [rows[k] for k in sorted(rows)]


def current_hour() -> int:
    """The hour (since the epoch) this host's clock is in. A window names whole hours,
    so a clock a few seconds off Redis's moves an edge only at the hour's turn; and it
    costs no round trip (on a cluster, TIME would ask each node)."""
    return int(time.time()) // 3600
