"""A Lua script called in one packed write and one read: redis-py's ``Script`` without
the per-call machinery around its command.

Every admission, claim and completion is one ``EVALSHA`` of up to fifty arguments.
Through ``Redis.execute_command`` such a call costs about 200 µs of the caller's CPU
on the machine of docs/benchmarks.md, half of it outside the socket: each argument
checked and encoded in Python, a retry wrapper, an event dispatch and the timing of
redis-py's observability hooks. Here the arguments are packed by hiredis in one call
(bytes pass as they are), sent on a connection of the client's own pool and the reply
read by the same parser: the bytes on the wire and the reply are those of redis-py.

Anything but the plain case takes redis-py's own path, unchanged: a pipeline, a
cluster client, a single-connection client, a reply of ``NOSCRIPT`` (the script is
loaded there), and a connection error or timeout. After such an error the command
goes once more through redis-py, whose retries (reconnect and backoff) then apply:
what a caller sees of a lost Redis is what redis-py's retries make of it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from typing import Any

import hiredis
import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

#: hiredis's packer; its stubs type the argument as a tuple of one item, not of many.
_pack: Any = hiredis.pack_command
#: The errors after which the command is sent again the ordinary way (redis-py retries
#: on the same ones).
_RETRIED = (redis.ConnectionError, redis.TimeoutError, socket.timeout)


class LeanScript(Script):
    """``Script`` whose plain calls skip ``execute_command``; see the module's text."""

    def __call__(self, keys: Sequence[Any] | None = None, args: Iterable[Any] | None = None,
                 client: Any = None) -> Any:
        target = self.registered_client if client is None else client
        pool = _plain_pool(target)
        if pool is None:
            return super().__call__(keys, args, client)
        keys = list(keys or ())
        args = list(args or ())
        encode = target.get_encoder().encode
        # Bytes (what the hot callers pass) as they are; the rest as redis-py encodes it,
        # so an argument it refuses (None, a bool) raises its DataError here too.
        packed = _pack(
            (b"EVALSHA", self.sha.encode(), b"%d" % len(keys),
             *(a if a.__class__ is bytes else encode(a) for a in keys + args)))
        conn = pool.get_connection()
        try:
            conn.send_packed_command([packed])
            return conn.read_response()
        except NoScriptError:
            pass  # redis-py's path loads it
        except _RETRIED:
            conn.disconnect()
        except BaseException:
            # Cut off mid-call (a gevent timeout, a caller gone): a reply may still come
            # on this connection, so it goes, not back to the pool with that reply.
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return super().__call__(keys, args, client)


def _plain_pool(client: Any) -> Any:
    """The connection pool of a plain ``redis.Redis`` that takes a connection per
    command, else None (a pipeline, a cluster, a single-connection client)."""
    if type(client) is not redis.Redis or client.connection is not None:
        return None
    return client.connection_pool
