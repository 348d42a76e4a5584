"""Access to Redis, in one place: the client, the error mapping, the scripts.

``connect`` makes the one kind of client every process uses (str replies, a
bounded socket timeout, Redis Cluster when asked); ``redis_errors`` turns
redis-py's errors into ``BackendUnavailable`` with an actionable message, so the
web answers 503 and the worker backs off; ``load_script`` registers one of
``carpool/backend/lua/*.lua``, its shared fragments (``lua/lib/*.lua``) pasted in. The
queue, leases, registry, GPU leases, audit and the durability check all reach Redis
through these three.
"""

from __future__ import annotations

import re
import select
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.resources import files
from typing import Any, cast

import redis
from redis.client import PubSub
from redis.cluster import RedisCluster
from redis.commands.core import Script

from carpool.backend.lean_script import LeanScript
from carpool.core.errors import BackendUnavailable

#: Error replies that mean "not now" (retry later), never "your request is wrong".
_UNAVAILABLE_REPLIES = ("OOM", "LOADING", "READONLY", "MASTERDOWN", "NOAUTH", "WRONGPASS",
                        "BUSY", "MISCONF", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
#: redis-py's classes for some of them; it strips the code ("OOM") from their text.
_UNAVAILABLE_CLASSES = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
                        redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)
#: Redis 6.2 wraps an error raised inside a script: "Error running script ... -OOM ...".
_IN_SCRIPT = re.compile(r"(?:^|: -)(" + "|".join(_UNAVAILABLE_REPLIES) + r")\b")


@contextmanager
def redis_errors() -> Iterator[None]:
    """Turn redis-py's errors into ``BackendUnavailable`` with an actionable message."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise BackendUnavailable(f"Redis is unreachable: {exc}") from exc
    except redis.ResponseError as exc:
        text = str(exc)
        code = _IN_SCRIPT.search(text)
        if isinstance(exc, redis.exceptions.OutOfMemoryError) or (code and code[1] == "OOM"):
            raise BackendUnavailable(
                "Redis is out of memory (maxmemory reached): new jobs are refused until "
                "workers drain the queue") from exc
        if isinstance(exc, _UNAVAILABLE_CLASSES) or code:
            raise BackendUnavailable(f"Redis refused the command: {text}") from exc
        raise


#: A line of a script that stands for the whole of a shared fragment,
#: ``carpool/backend/lua/lib/<name>.lua`` (Redis scripts cannot load each other, so code
#: two scripts share is pasted in at load). A fragment may include another.
_INCLUDE = re.compile(r"^--#include (lib/\w+\.lua)$", re.MULTILINE)


def open_pubsub(client: redis.Redis, *, ignore_subscribe_messages: bool = False) -> PubSub:
    """A pub/sub connection of ``client``: the one place that calls ``Redis.pubsub``.

    redis-py left ``pubsub()`` untyped before 8.2 and types it since; the call goes
    through ``Any`` so that strict type checking passes on either, without a
    ``type: ignore`` that one version needs and the other flags as unused."""
    untyped: Any = client
    pubsub: PubSub = untyped.pubsub(ignore_subscribe_messages=ignore_subscribe_messages)
    return pubsub


def next_message(pubsub: PubSub) -> dict[str, Any] | None:
    """The subscription's next message, blocking until one comes (None: a reply that is
    not one to hand over). A read without a timeout goes straight to the socket; one
    with a timeout polls the socket first, which under gevent doubles the CPU per
    message. From redis-py 8.2 the read outlasts the client's socket timeout (before,
    an idle channel timed out); redis-py documents ``timeout=None`` but types it a float.

    Nothing is sent while it blocks: a Redis gone without a reset is found by the TCP
    keepalive that redis-py turns on (probes after 30 s idle)."""
    untyped: Any = pubsub
    message: dict[str, Any] | None = untyped.get_message(timeout=None)
    return message


def script_source(name: str) -> str:
    """``carpool/backend/lua/<name>.lua`` with its ``--#include`` lines resolved."""
    return expand_includes(files("carpool.backend").joinpath("lua", f"{name}.lua").read_text())


def expand_includes(source: str, done: set[str] | None = None) -> str:
    """``source`` with each ``--#include lib/<name>.lua`` line replaced by that fragment,
    once per script: a fragment already pasted (another fragment included it too) leaves
    its line empty, so its functions are defined once."""
    seen = set() if done is None else done

    def paste(match: re.Match[str]) -> str:
        path = match.group(1)
        if path in seen:
            return ""
        seen.add(path)
        return expand_includes(files("carpool.backend").joinpath("lua", path).read_text(),
                               seen)

    return _INCLUDE.sub(paste, source)


def load_script(client: redis.Redis, name: str) -> Script:
    """Register ``carpool/backend/lua/<name>.lua`` once; redis-py reloads it on NOSCRIPT.
    Its plain calls are lean (carpool/backend/lean_script.py)."""
    return LeanScript(client, script_source(name))


def connect(
    url: str, *, socket_timeout_s: float | None = 5.0, max_connections: int | None = None,
    cluster: bool = False,
) -> redis.Redis:
    """A client for ``url`` that returns str; the timeout bounds a hung Redis.

    ``cluster``: ``url`` names any node of a Redis Cluster, and the client is redis-py's
    ``RedisCluster``, which routes each command (and each script, by its first key) to
    the shard that owns it. It offers every command carpool uses, so it is typed here
    as the client it stands in for.

    redis-py's default pool fails a command ("Too many connections") once 100
    are in use. With ``max_connections``, a command that finds them all busy
    waits for one, up to the socket timeout: what a web process whose thousands
    of greenlets share one client needs.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": 2.0,
        "health_check_interval": 30,
    }
    if cluster:
        return cast(redis.Redis, RedisCluster.from_url(url, **options))
    if max_connections is None:
        return redis.Redis.from_url(url, **options)
    pool = _WebPool.from_url(
        url, max_connections=max_connections, timeout=socket_timeout_s, **options
    )
    return redis.Redis.from_pool(pool)  # the client owns the pool: close() closes both


def _original_poll() -> Callable[[], Any]:
    """The operating system's ``select.poll``, also where gevent has patched it."""
    try:
        from gevent import monkey
    except ImportError:
        return select.poll
    original: Callable[[], Any] = monkey.get_original("select", "poll")
    return original


_os_poll = _original_poll()


class _WebPool(redis.BlockingConnectionPool):
    """The web's pool: redis-py's check of each connection handed out, at a twentieth of
    its cost under gevent.

    Before each command redis-py polls the connection's socket, so that one holding a
    stale reply or closed by the server is replaced. Under gevent that poll is gevent's,
    which switches to the hub even with a timeout of 0: ~50 µs of CPU per command,
    more than the command itself. The operating system's poll with a timeout of 0
    answers the same question at once.
    """

    def ensure_connection(self, connection: Any) -> None:
        # A client-side cache, or RESP3 asked for in the URL: what is pending may be
        # push messages to read, so redis-py's own way. carpool's clients set no
        # protocol and speak RESP3 (redis-py's default) without a cache or tracking, to
        # a Redis that sends them no maintenance notices: pending bytes on an idle
        # connection are a stale reply or a closed socket, which redis-py too replaces.
        if self.cache is not None or str(self.connection_kwargs.get("protocol", 2)) == "3":
            super().ensure_connection(connection)
            return
        connection.connect()
        if not _readable(connection):
            return
        connection.disconnect()  # a stale reply, or the server closed it: a new one
        connection.connect()
        if _readable(connection):
            raise redis.ConnectionError("Connection not ready")


def _readable(connection: Any) -> bool:
    """Whether the connection's socket has bytes (or an end) to read, now."""
    sock = connection._sock
    if sock is None:
        return False
    if hasattr(sock, "pending") and sock.pending():  # TLS: bytes decrypted already
        return True
    return readable_now(sock)


def readable_now(sock: Any) -> bool:
    """Whether ``sock`` has bytes, an end or an error to read now, without waiting.

    The operating system's poll: any descriptor number (``select.select`` raises
    ValueError past 1023, which a web process with a thousand connections reaches),
    and no switch to gevent's hub.
    """
    poller = _os_poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
