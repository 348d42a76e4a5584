"""The start-up check of Redis's persistence and eviction, on private redis-servers."""

from __future__ import annotations

import logging

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from carpool.backend.durability import (
    check_durability,
    problems,
    read_persistence,
    wait_for_redis,
)
from carpool.core.errors import ConfigError
from tests.support.procs import free_port
from tests.support.redisproc import private_redis

DURABLE = ("--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory", "64mb",
           "--maxmemory-policy", "noeviction")


def test_a_durable_bounded_redis_passes() -> None:
    with private_redis(*DURABLE) as server, server.client() as c:
        assert check_durability(c, require=True, who="test") == []


def test_no_aof_an_evicting_policy_and_no_maxmemory_are_each_named(
        caplog: pytest.LogCaptureFixture) -> None:
    with private_redis("--appendonly", "no", "--maxmemory-policy", "allkeys-lru") as server, \
            server.client() as c, caplog.at_level(logging.WARNING):
        found = check_durability(c, require=False, who="web")
    assert len(found) == 3
    text = " ".join(found)
    assert "appendonly no" in text and "allkeys-lru" in text and "maxmemory is 0" in text
    assert sum("web: " in r.getMessage() for r in caplog.records) == 3


def test_require_durable_refuses_a_redis_without_aof() -> None:
    with private_redis("--appendonly", "no") as server, server.client() as c:
        with pytest.raises(ConfigError, match="CARPOOL_REQUIRE_DURABLE=1 and Redis keeps no"):
            check_durability(c, require=True, who="worker")


def test_config_renamed_away_falls_back_to_info() -> None:
    with private_redis(*DURABLE, "--rename-command", "CONFIG", "") as server, \
            server.client() as c:
        found = read_persistence(c)
    assert (found.source, found.appendonly, found.policy) == ("INFO", True, "noeviction")
    assert problems(found) == []


def test_a_user_allowed_neither_config_nor_info_cannot_be_checked_and_require_refuses() -> None:
    with private_redis(*DURABLE) as server:
        with server.client() as admin:
            admin.acl_setuser("carpool", enabled=True, passwords=["+s3cret-s3cret"],
                              keys=["*"], commands=["+@all", "-config", "-info"])
        url = f"redis://carpool:s3cret-s3cret@127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(url, decode_responses=True) as c:
            assert read_persistence(c).source == "nothing"
            with pytest.raises(ConfigError, match="cannot be checked"):
                check_durability(c, require=True, who="web")


def test_an_unreachable_redis_is_not_a_reason_to_refuse(
        caplog: pytest.LogCaptureFixture) -> None:
    with redis.Redis(port=free_port(), socket_connect_timeout=1) as c, \
            caplog.at_level(logging.WARNING):
        assert check_durability(c, require=True, who="web") == []
    assert "not checked" in caplog.text


def test_waiting_for_redis_stops_when_asked_and_fails_fast_on_a_wrong_password() -> None:
    pauses: list[float] = []
    no_retries = Retry(NoBackoff(), 0)  # redis-py's own retries would take seconds a try
    with redis.Redis(port=free_port(), socket_connect_timeout=1, retry=no_retries) as c:
        assert not wait_for_redis(c, "test", lambda: len(pauses) >= 3, pauses.append)
    assert pauses == [0.25, 0.5, 1.0]  # backing off between tries
    with private_redis(password="s3cret-s3cret") as server:
        url = f"redis://:wrong-wrong@127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(url) as c, pytest.raises(ConfigError, match="credentials"):
            wait_for_redis(c, "test", lambda: False, pauses.append)  # waiting would not help
    assert len(pauses) == 3
