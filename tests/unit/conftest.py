"""Unit tests need no Redis: a connection opened by one, through any fixture or
object, fails the test with where it belongs. Without a Redis client installed (the
GPU machine's image) there is nothing to refuse."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import redis.connection
    except ImportError:
        return

    def refuse(self: redis.connection.AbstractConnection, *args: Any, **kwargs: Any) -> None:
        pytest.fail("a test under tests/unit connected to Redis: it belongs in tests/redis")

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", refuse)
