"""Lean script calls (carpool/backend/lean_script.py) answer what redis-py's ``Script``
answers, skip ``execute_command`` on a plain client, and take redis-py's path for the
rest: a pipeline, NOSCRIPT, a restarted Redis, a call cut off mid-read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from carpool.backend.connection import connect, load_script
from carpool.backend.lean_script import LeanScript
from tests.support.redisproc import private_redis

#: Echoes its keys and arguments back, with their counts: what Redis was sent, as it got it.
ECHO = "return {#KEYS, #ARGV, KEYS, ARGV}"
#: Retries of the client whose Redis is lost for good.
RETRIES = 2
#: Replies of every RESP2 kind, and an error reply.
KINDS = ("if ARGV[1] == 'nil' then return nil end "
         "if ARGV[1] == 'int' then return 42 end "
         "if ARGV[1] == 'status' then return redis.status_reply('FINE') end "
         "if ARGV[1] == 'nested' then return {1, {'a', {'b'}}, 'é'} end "
         "if ARGV[1] == 'err' then return redis.error_reply('ERR nope: ' .. ARGV[2]) end "
         "return ARGV[1]")


@pytest.fixture(params=["plain", "web pool"])
def client(request: pytest.FixtureRequest, redis_url: str) -> Iterator[redis.Redis]:
    """The worker's client (redis-py's pool) and the web's (a blocking pool)."""
    c = connect(redis_url, max_connections=4 if request.param == "web pool" else None)
    yield c
    c.close()


class _Counted:
    """Counts the commands that go through ``execute_command``."""

    def __init__(self, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
        self.commands: list[Any] = []
        original = client.execute_command

        def counted(*args: Any, **options: Any) -> Any:
            self.commands.append(args[0])
            return original(*args, **options)

        monkeypatch.setattr(client, "execute_command", counted)


ARGUMENT_CORPUS: list[tuple[list[Any], list[Any]]] = [
    ([], []),
    (["{t}a"], []),
    ([], ["x"]),
    (["{t}a", b"{t}b"], [b"bytes", "str", "\u00e9\u4e2d\U0001f600", 7, -3, 2.5, 0, "", b""]),
    ([], [b"\x00\r\n*3\r\n$-1\r\n", "line\r\nbreak", 10 ** 20, 1e-300]),
    ([bytearray(b"{t}ba")], [memoryview(b"mv"), bytearray(b"ba"), float("inf")]),
    ([f"{{t}}k{i}" for i in range(20)], [f"v{i}".encode() for i in range(60)]),
]


@pytest.mark.parametrize("keys,args", ARGUMENT_CORPUS)
def test_redis_gets_the_same_keys_and_arguments_as_through_redis_py(
        client: redis.Redis, keys: list[Any], args: list[Any]) -> None:
    lean, plain = LeanScript(client, ECHO), Script(client, ECHO)
    assert lean(keys=keys, args=args) == plain(keys=keys, args=args)
    assert lean(keys=keys, args=args)[:2] == [len(keys), len(args)]


@pytest.mark.parametrize("what", ["nil", "int", "status", "nested", "text"])
def test_every_kind_of_reply_is_redis_pys(client: redis.Redis, what: str) -> None:
    assert LeanScript(client, KINDS)(args=[what]) == Script(client, KINDS)(args=[what])


def test_an_error_reply_raises_redis_pys_error_and_the_connection_serves_on(
        client: redis.Redis) -> None:
    lean = LeanScript(client, KINDS)
    with pytest.raises(redis.ResponseError, match="nope: why") as caught:
        lean(args=["err", "why"])
    with pytest.raises(redis.ResponseError) as plain:
        Script(client, KINDS)(args=["err", "why"])
    assert type(caught.value) is type(plain.value) and str(caught.value) == str(plain.value)
    assert lean(args=["int"]) == 42


@pytest.mark.parametrize("bad", [None, True])
def test_an_argument_redis_py_refuses_is_refused_alike(client: redis.Redis, bad: Any) -> None:
    with pytest.raises(redis.DataError):
        LeanScript(client, ECHO)(args=[bad])
    assert client.ping()


def test_a_plain_call_skips_execute_command_and_a_pipeline_takes_redis_pys_path(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    script = load_script(client, "admit")  # what carpool's stores hold
    assert isinstance(script, LeanScript)
    echo = LeanScript(client, ECHO)
    counted = _Counted(client, monkeypatch)
    assert echo(keys=["{t}a"], args=["x"]) == [1, 1, ["{t}a"], ["x"]]
    assert counted.commands == []  # the lean path, not redis-py's
    with client.pipeline() as pipe:
        echo(keys=["{t}a"], args=["y"], client=pipe)
        assert pipe.execute()[-1] == [1, 1, ["{t}a"], ["y"]]


def test_a_script_redis_forgot_is_loaded_through_redis_py(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with private_redis() as server:  # SCRIPT FLUSH would empty the shared Redis's cache
        client = connect(server.url)
        echo = LeanScript(client, ECHO)
        assert echo(args=["a"])[1] == 1
        client.script_flush()
        counted = _Counted(client, monkeypatch)
        assert echo(args=["b"]) == [0, 1, [], ["b"]]
        assert "SCRIPT LOAD" in counted.commands  # NOSCRIPT sent it the ordinary way
        client.close()


def test_a_restarted_redis_is_reached_again_and_the_script_reloaded() -> None:
    with private_redis() as server:
        client = connect(server.url)
        echo = LeanScript(client, ECHO)
        assert echo(args=["before"])[3] == ["before"]
        server.kill()
        server.restart()  # its pooled connection is dead; the script is gone
        assert echo(args=["after"])[3] == ["after"]
        client.close()


def test_a_call_cut_off_mid_read_does_not_return_its_connection_with_a_reply_pending(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    echo = LeanScript(client, ECHO)
    echo(args=["warm"])

    class CutOff(BaseException):
        """What gevent raises in a greenlet whose timeout ran out."""

    seen: list[Any] = []
    original = redis.connection.AbstractConnection.read_response

    def cut(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(self)
        raise CutOff

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", cut)
    with pytest.raises(CutOff):
        echo(args=["cut"])
    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", original)
    assert seen and seen[0]._sock is None  # disconnected: its reply can never be read
    assert echo(args=["next"])[3] == ["next"]


def test_an_error_reply_keeps_its_connection(client: redis.Redis,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    lean = LeanScript(client, KINDS)
    lean(args=["int"])
    pool: Any = client.connection_pool
    released: list[Any] = []
    release = pool.release

    def noted(conn: Any) -> None:
        released.append(conn._sock)
        release(conn)

    monkeypatch.setattr(pool, "release", noted)
    with pytest.raises(redis.ResponseError):
        lean(args=["err", "x"])
    assert lean(args=["int"]) == 42
    assert released[0] is not None and released[1] is released[0]  # no reconnect


def _losing(monkeypatch: pytest.MonkeyPatch, times: int) -> list[Any]:
    """``read_response`` loses its connection ``times`` times; the sockets it lost."""
    lost: list[Any] = []
    original = redis.connection.AbstractConnection.read_response

    def lose(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(lost) < times:
            lost.append(self._sock)
            raise redis.ConnectionError("Connection closed by server.")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", lose)
    return lost


@pytest.mark.parametrize("kind", [LeanScript, Script])
def test_a_connection_lost_mid_call_is_closed_and_raised_as_by_redis_py(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch, kind: type[Script]) -> None:
    """carpool's clients retry nothing (redis-py's pools default to no retries): the
    caller learns of the loss (carpool: ``BackendUnavailable``), its reply never read."""
    echo = kind(client, ECHO)
    echo(args=["warm"])
    lost = _losing(monkeypatch, 1)
    with pytest.raises(redis.ConnectionError):
        echo(args=["lost"])
    assert len(lost) == 1 and lost[0].fileno() == -1
    assert echo(args=["next"])[3] == ["next"]


@pytest.mark.parametrize("kind", [LeanScript, Script])
def test_a_lost_redis_is_tried_as_often_as_redis_pys_retry_policy_says(
        redis_url: str, monkeypatch: pytest.MonkeyPatch, kind: type[Script]) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True,
                                  retry=Retry(NoBackoff(), RETRIES))
    echo = kind(client, ECHO)
    echo(args=["warm"])
    lost = _losing(monkeypatch, 100)
    with pytest.raises(redis.ConnectionError):
        echo(args=["never"])
    assert len(lost) == 1 + RETRIES
    client.close()


def test_with_retries_a_lost_connection_is_reopened_and_the_call_sent_again(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True,
                                  retry=Retry(NoBackoff(), RETRIES))
    echo = LeanScript(client, ECHO)
    echo(args=["warm"])
    lost = _losing(monkeypatch, 1)
    counted = _Counted(client, monkeypatch)
    assert echo(args=["again"])[3] == ["again"]
    assert len(lost) == 1 and lost[0].fileno() == -1  # closed, its reply never read
    assert counted.commands == []  # retried on the lean path
    client.close()
