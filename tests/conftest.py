"""Shared fixtures: a real Redis, with a fresh key prefix per test so tests never collide.

The folder a test lives in says what it needs: ``unit/`` nothing (no Redis, no
process), ``redis/`` a real Redis, ``e2e/`` real gunicorn / Celery / carpool
processes (each marked ``e2e`` here, so ``-m "not e2e"`` leaves them out),
``deploy/`` the compose, Kubernetes and monitoring files. Helpers: ``support/``.

Nothing here imports Redis until a fixture asks for it: the ``gpu`` tests run on
the GPU machine's image, which may have no Redis client (``ops/gpu/check.sh``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from carpool.core.settings import Settings, load_settings

if TYPE_CHECKING:
    import redis

    from carpool.backend.keys import Keys
    from carpool.backend.queue import Queue

#: A model no worker serves, with a tiny bin: it stays full once filled.
TINY_TOML = """
[models.tiny]
kind = "synthetic"
measure = "size"
[[models.tiny.bins]]
name = "only"
max_size = 10
max_batch = 2
max_wait_ms = 5
max_depth = 3
"""
#: The Redis the tests use; CI starts one here when none runs.
REDIS_URL = os.environ.get("CARPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TESTS = Path(__file__).resolve().parent
#: The folders a test file may live in, by what its tests need.
KINDS = ("unit", "redis", "e2e", "deploy")


def kind_of(path: Path) -> str | None:
    """The folder under tests/ that ``path`` lies in, if it is one of ``KINDS``
    (None for tests/ itself and for support/)."""
    parts = path.resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in KINDS else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if kind_of(item.path) == "e2e":
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
def key_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(request: pytest.FixtureRequest, redis_url: str,
           key_prefix: str) -> Iterator[redis.Redis]:
    import redis

    from carpool.backend.connection import connect
    from carpool.backend.keys import Keys

    if kind_of(request.path) == "unit":
        pytest.fail("a test under tests/unit asked for Redis: it belongs in tests/redis")
    c = connect(redis_url)
    try:
        c.ping()
    except redis.ConnectionError:
        pytest.fail(f"no Redis at {redis_url}: start one (see .ci/run)")
    yield c
    keys = [k for pattern in Keys(key_prefix).patterns
                for k in c.scan_iter(match=pattern, count=1000)]
    if keys:
        c.delete(*keys)
    c.close()


@pytest.fixture
def keys(key_prefix: str) -> Keys:
    from carpool.backend.keys import Keys

    return Keys(key_prefix)


@pytest.fixture
def queue(client: redis.Redis, keys: Keys) -> Queue:
    from carpool.backend.queue import Queue

    return Queue(client, keys)


def make_env(redis_url: str, key_prefix: str, **extra: str) -> dict[str, str]:
    """The environment a carpool process under test runs with."""
    env = {
        "CARPOOL_REDIS_URL": redis_url,
        "CARPOOL_KEY_PREFIX": key_prefix,
        # Shedding off unless a test is about it (those set their own bound): on a busy
        # test machine a request may well wait 300 ms in the accept queue, and a test of
        # another feature must not read that 503 as its own failure.
        "CARPOOL_WEB_MAX_QUEUE_MS": "0",
    }
    env.update(extra)
    return env


@pytest.fixture
def settings(redis_url: str, key_prefix: str) -> Settings:
    return load_settings(make_env(redis_url, key_prefix))
