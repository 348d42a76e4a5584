"""The web's connection pool (carpool/backend/connection.py ``_WebPool``) checks each
connection it hands out with the operating system's poll, not gevent's, and still
replaces one that is unfit: a reply left unread, or a socket the server closed."""

from __future__ import annotations

import select
import socket
from typing import Any

import redis

from carpool.backend import connection
from carpool.backend.connection import connect

#: What a web process passes (web/app.py): the blocking pool.
CONNECTIONS = 4
BOUND_S = 5.0


def _pooled(redis_url: str) -> redis.Redis:
    client = connect(redis_url, max_connections=CONNECTIONS)
    assert isinstance(client.connection_pool, connection._WebPool)
    return client


def test_a_connection_left_with_an_unread_reply_is_replaced(redis_url: str) -> None:
    client = _pooled(redis_url)
    pool = client.connection_pool
    stale: Any = pool.get_connection()
    stale.send_command("ECHO", "stale")  # its reply is never read
    assert select.select([stale._sock], [], [], BOUND_S)[0]  # it has arrived
    pool.release(stale)
    # The next command gets its own reply, not the stale one.
    assert client.echo("fresh") == "fresh"
    client.close()


def test_a_connection_the_server_closed_is_replaced_before_it_is_used(redis_url: str) -> None:
    client = _pooled(redis_url)
    client.client_setname("web-pool-test")
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    (mine,) = [c for c in admin.client_list() if c.get("name") == "web-pool-test"]
    admin.client_kill_filter(_id=mine["id"])
    # Replaced by the pool's check before the command: no error, and the new socket
    # is one the server has not named.
    assert client.echo("after") == "after"
    assert "web-pool-test" not in {c.get("name") for c in admin.client_list()}
    admin.close()
    client.close()


def test_a_healthy_connection_is_kept(redis_url: str) -> None:
    client = _pooled(redis_url)
    client.client_setname("web-pool-kept")
    assert client.echo("x") == "x"
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    assert "web-pool-kept" in {c.get("name") for c in admin.client_list()}  # same socket
    admin.close()
    client.close()


def test_connections_probe_an_idle_redis_with_tcp_keepalive(redis_url: str) -> None:
    """A subscriber blocked on its channel sends nothing: only keepalive (redis-py's
    default, which carpool relies on) finds a Redis that vanished without a reset."""
    for client in (connect(redis_url), _pooled(redis_url)):
        conn: Any = client.connection_pool.get_connection()
        assert conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        client.connection_pool.release(conn)
        client.close()
