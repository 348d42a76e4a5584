"""A private stack for one policy: its own gunicorn and Celery workers, key prefix, config.

Each policy of a run gets fresh processes, started with the canonical command
lines plus what must differ per process (the port, the worker's name), and its
keys are deleted when it stops, so runs on one Redis never see each other's jobs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.bench.policies import Policy, write_config
from carpool.core.settings import Settings, load_settings
from carpool.stack.command_lines import argv
from carpool.stack.waiting import wait_until

# The shipped command lines (carpool/stack/commands.toml); the port and worker count travel
# in the environment, as in production.
WEB_ARGV = argv("web")
WORKER_ARGV = argv("worker")
#: Bound on a process becoming ready (a cold Celery worker takes a few seconds).
START_TIMEOUT_S = 60.0
#: A warm shutdown finishes the batch in hand; a full batch is well under this.
STOP_TIMEOUT_S = 20.0
#: How often readiness is checked while waiting for it.
READY_POLL_S = 0.1


@dataclass(frozen=True)
class StackSpec:
    policy: Policy
    redis_url: str
    workers: int = 1
    web: bool = True
    web_workers: int | None = None
    cost_ms: tuple[float, float] = (20.0, 1.0)
    #: Bins are made at least this deep (a drain admits its whole backlog at once).
    min_depth: int = 0
    model: str = "synthetic"
    #: A checkout whose carpool and web the processes import (PYTHONPATH), else this one.
    root: Path | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(ready: Callable[[], bool], what: str, proc: subprocess.Popen[bytes],
               log: Path) -> None:
    """Poll ``ready()`` until true; fail with the log's tail if ``proc`` dies or time runs out."""

    def failed(reason: str) -> RuntimeError:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        return RuntimeError(f"{what} did not become ready ({reason}):\n{tail}")

    def exited() -> None:
        if proc.poll() is not None:
            raise failed(f"exit {proc.returncode}")

    try:
        wait_until(ready, START_TIMEOUT_S, what, check=exited, poll_s=READY_POLL_S)
    except TimeoutError as exc:
        raise failed(str(exc)) from None


def _says_ready(log: Path) -> bool:
    """Celery logs "<name>@<host> ready." once the worker (and its batch loop) runs."""
    return " ready." in log.read_text(errors="replace")


class Stack:
    """Context manager: processes up on enter, down and keys deleted on exit."""

    def __init__(self, spec: StackSpec, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}-{spec.policy.name}"
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = self._env()
        self.settings: Settings = load_settings(self.env)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        base = load_settings({"CARPOOL_REDIS_URL": self.spec.redis_url})
        model = base.catalogue.get(self.spec.model)
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = write_config(self.workdir / f"{self.spec.policy.name}.toml", model,
                              self.spec.policy.bins(model, self.spec.min_depth),
                              self.spec.policy.max_queue_ms)
        a_ms, b_ms = self.spec.cost_ms
        return {**os.environ, "CARPOOL_REDIS_URL": self.spec.redis_url,
                "CARPOOL_KEY_PREFIX": self.prefix, "CARPOOL_CONFIG": str(config),
                "CARPOOL_SYNTHETIC_COST_MS": f"{a_ms:g},{b_ms:g}",
                "CARPOOL_MODELS": self.spec.model, "PYTHONUNBUFFERED": "1",
                # Several bench workers share this host: none takes the metrics port.
                "CARPOOL_WORKER_METRICS_PORT": "0",
                **self.spec.policy.env,
                **({"PYTHONPATH": str(self.spec.root)} if self.spec.root else {})}

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> tuple[
            subprocess.Popen[bytes], Path]:
        log = self.workdir / f"{self.spec.policy.name}-{name}.log"
        with log.open("wb") as out:
            program = str(Path(sys.executable).parent / argv[0])  # this venv's, not PATH's
            proc = subprocess.Popen([program, *argv[1:]], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def __enter__(self) -> Stack:
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_all(self) -> None:
        waits: list[tuple[Callable[[], bool], str, subprocess.Popen[bytes], Path]] = []
        for i in range(self.spec.workers):
            name = f"w{i}-{self.prefix}"
            # Our own node name (the later -n wins), so two workers on one host differ.
            argv = [*WORKER_ARGV, "-n", f"{name}@%h", "--loglevel", "INFO"]
            proc, log = self._start(f"worker{i}", argv, {**self.env, "CARPOOL_WORKER_NAME": name})
            waits.append((partial(_says_ready, log), f"worker {name}", proc, log))
        if self.spec.web:
            env = {**self.env, "CARPOOL_WEB_BIND": f"127.0.0.1:{self.port}"}
            if self.spec.web_workers:
                env["CARPOOL_WEB_WORKERS"] = str(self.spec.web_workers)
            proc, log = self._start("web", WEB_ARGV, env)
            waits.append((self._web_ready, "web", proc, log))
        for ready, what, proc, log in waits:
            wait_ready(ready, what, proc, log)

    def _web_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/readyz", timeout=1) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        client = connect(self.spec.redis_url)
        stale = [k for pattern in Keys(self.prefix).patterns
                 for k in client.scan_iter(match=pattern, count=1000)]
        for i in range(0, len(stale), 1000):
            client.delete(*stale[i : i + 1000])
        client.close()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
