"""A Lua script called in one packed write and one read: redis-py's ``Script`` without
the per-call machinery around its command.

Every admission, claim and completion is one ``EVALSHA`` of up to fifty arguments.
Through ``Redis.execute_command`` such a call costs about 200 µs of the caller's CPU
on the machine of docs/benchmarks.md, half of it outside the socket: each argument
checked and encoded in Python, a retry wrapper, an event dispatch and the timing of
redis-py's observability hooks. Here the arguments are packed by hiredis in one call
(bytes pass as they are), sent on a connection of the client's own pool and the reply
read by the same parser: the bytes on the wire and the reply are those of redis-py.

A lost connection or a timeout is retried by the connection's own retry policy, as
``execute_command`` retries it (closed, reopened, sent again, with backoff); an error
reply is raised as redis-py raises it, and the connection kept. The rest takes
redis-py's own path, unchanged: a pipeline, a cluster client, a single-connection
client, and a reply of ``NOSCRIPT`` (the script is loaded there, one round trip more).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import hiredis
import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

#: hiredis's packer; its stubs type the argument as a tuple of one item, not of many.
_pack: Any = hiredis.pack_command


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
        packed = _pack((b"EVALSHA", self.sha.encode(), b"%d" % len(keys),
                        *(a if a.__class__ is bytes else _encoded(a, encode)
                          for a in keys + args)))
        conn = pool.get_connection()
        try:
            # The connection's retry policy, as execute_command applies it: a lost
            # connection closed, reopened and the command sent again, with backoff.
            return conn.retry.call_with_retry(lambda: _send_and_read(conn, packed),
                                              lambda _error: conn.disconnect())
        except NoScriptError:
            pass  # redis-py's path loads it, below
        except redis.ResponseError:
            raise  # an error reply, read whole: the connection serves on
        except BaseException:
            # Cut off mid-call (a gevent timeout, a caller gone) or out of retries: a
            # reply may still come on this connection, so it goes, not back to the pool.
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return super().__call__(keys, args, client)


def _encoded(arg: Any, encode: Any) -> Any:
    """``arg``, not bytes (those pass as they are), as redis-py sends it: through the
    client's encoder, which refuses None and bools (DataError); bytearray and
    memoryview as bytes, as redis-py hands them to hiredis."""
    value = encode(arg)
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else value


def _send_and_read(conn: Any, packed: bytes) -> Any:
    conn.send_packed_command([packed])
    return conn.read_response()


def _plain_pool(client: Any) -> Any:
    """The connection pool of a plain ``redis.Redis`` that takes a connection per
    command, else None (a pipeline, a cluster, a single-connection client)."""
    if type(client) is not redis.Redis or client.connection is not None:
        return None
    return client.connection_pool
