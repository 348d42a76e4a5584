"""At start: does this Redis keep the promise "an accepted job is never lost"?

carpool's durability is Redis's: without an append-only file a Redis restart
forgets every queued job, and an evicting ``maxmemory-policy`` drops job records
under memory pressure. Web and worker read the settings at start (``CONFIG GET``,
or ``INFO`` where CONFIG is renamed away or not permitted) and warn, or refuse to
start when ``CARPOOL_REQUIRE_DURABLE=1``. A process started before its Redis
(``wait_for_redis``) waits for it first, so the check is made, not skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis

from carpool.backend.connection import redis_errors
from carpool.core.errors import BackendUnavailable, ConfigError

log = logging.getLogger(__name__)

#: The first pause between tries to reach Redis at start; doubled after each try up to
#: the last: a Redis starting with its stack answers within a second or two, and one
#: down for minutes is asked every few seconds, not flooded.
FIRST_RETRY_S = 0.25
LAST_RETRY_S = 5.0


@dataclass(frozen=True)
class RedisPersistence:
    """What Redis says of its persistence and eviction; None where it would not say."""

    appendonly: bool | None
    appendfsync: str | None
    maxmemory: int | None
    policy: str | None
    source: str  # "CONFIG", "INFO" or "nothing"


def _config(client: redis.Redis) -> RedisPersistence:
    values: dict[str, Any] = {}
    for name in ("appendonly", "appendfsync", "maxmemory", "maxmemory-policy"):
        reply = cast(dict[str, Any], client.config_get(name))  # one name a call: Redis 6.2
        values.update(reply)
    return RedisPersistence(
        appendonly=values["appendonly"] == "yes", appendfsync=values["appendfsync"],
        maxmemory=int(values["maxmemory"]), policy=values["maxmemory-policy"], source="CONFIG")


def _info(client: redis.Redis) -> RedisPersistence:
    persistence: dict[str, Any] = client.info("persistence")
    memory: dict[str, Any] = client.info("memory")
    return RedisPersistence(
        appendonly=bool(int(persistence["aof_enabled"])), appendfsync=None,
        maxmemory=int(memory["maxmemory"]), policy=str(memory["maxmemory_policy"]),
        source="INFO")


def read_persistence(client: redis.Redis) -> RedisPersistence:
    """Ask CONFIG GET, then INFO; raises BackendUnavailable when Redis is unreachable."""
    for reader in (_config, _info):
        try:
            with redis_errors():
                return reader(client)
        except (redis.ResponseError, KeyError) as exc:  # renamed, NOPERM, or a fork's INFO
            log.info("Redis would not say through %s: %s", reader.__name__.strip("_"), exc)
    return RedisPersistence(None, None, None, None, source="nothing")


def problems(p: RedisPersistence) -> list[str]:
    """Each way this Redis may lose or evict an accepted job, as a sentence."""
    if p.source == "nothing":
        return ["Redis allows neither CONFIG GET nor INFO, so its persistence and eviction "
                "settings cannot be checked"]
    found = []
    if not p.appendonly:
        found.append("Redis keeps no append-only file (appendonly no): a restart of Redis "
                     "forgets every queued and running job; set appendonly yes")
    if p.appendfsync == "no":
        found.append("appendfsync no: the kernel decides when the AOF reaches the disk (up to "
                     "~30 s of accepted jobs lost on power loss); use everysec or always")
    if p.policy != "noeviction":
        found.append(f"maxmemory-policy is {p.policy}: under memory pressure Redis evicts job "
                     "records and bins, and accepted jobs vanish; set noeviction")
    if p.maxmemory == 0:
        found.append("maxmemory is 0 (no limit): a flood grows Redis until the kernel kills "
                     "it, instead of answering 503; set a maxmemory below the host's memory")
    return found


def check_durability(client: redis.Redis, *, require: bool, who: str) -> list[str]:
    """Warn about each problem; raise ConfigError for any of them when ``require``."""
    try:
        found = problems(read_persistence(client))
    except BackendUnavailable as exc:
        # Not a reason to refuse: web and worker wait for Redis and recover by themselves.
        log.warning("%s: Redis durability not checked at start (%s)", who, exc)
        return []
    for text in found:
        log.warning("%s: %s", who, text)
    if require and found:
        raise ConfigError(f"{who}: CARPOOL_REQUIRE_DURABLE=1 and " + "; ".join(found))
    return found


def wait_for_redis(client: redis.Redis, who: str, should_stop: Callable[[], bool],
                   pause: Callable[[float], object] = time.sleep) -> bool:
    """Block until Redis answers PING (loaded, and with this password); False if
    ``should_stop()`` comes first. A process started before its Redis (compose and
    Kubernetes start them together; Redis restarts) waits, saying on what at each try:
    exiting instead made its supervisor's restarts a crash loop that stopped the stack.
    Redis offers nothing to block on while it is away, so each try is bounded by the
    client's connect timeout and the pause between tries by LAST_RETRY_S."""
    retry_s, tries = FIRST_RETRY_S, 0
    while not should_stop():
        try:
            with redis_errors():
                client.ping()
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, redis.AuthenticationError):  # no wait will help
                raise ConfigError(f"{who}: Redis refused its credentials ({exc.__cause__}): "
                                  "check the password in CARPOOL_REDIS_URL") from exc
            tries += 1
            log.warning("%s: waiting for Redis (%s); trying again in %.2g s", who, exc,
                        retry_s)
            pause(retry_s)
            retry_s = min(retry_s * 2, LAST_RETRY_S)
            continue
        if tries:
            log.info("%s: Redis answers, after %d tries", who, tries)
        return True
    return False
