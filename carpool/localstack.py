"""`carpool up`: Redis, gunicorn, N Celery workers and Flower, stopped cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from carpool.redis_local import LocalRedis, answers, choose_redis
from carpool.settings import DEFAULT_WORKER_METRICS_PORT

#: Grace for children to finish after SIGTERM (a worker finishes its batch in hand).
STOP_GRACE_S = 30.0


def web_command() -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", "python:web.gunicorn_conf", "web:create_app()"]


def worker_command(index: int) -> list[str]:
    # --pool solo: the batching loop owns the GPU; one process per GPU, and CUDA
    # must never be forked into a child.
    return [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
            "--pool", "solo", "-E", "-n", f"worker{index}@%h", "--loglevel", "INFO"]


#: Flower's task list: each batch's (model, bin, size) and its result beside its runtime.
FLOWER_TASKS_COLUMNS = "name,uuid,state,args,result,received,started,runtime,worker"


def flower_command(port: int) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "worker.celery_app", "flower",
            f"--port={port}", "--address=127.0.0.1", f"--tasks_columns={FLOWER_TASKS_COLUMNS}"]


@dataclass
class Stack:
    """The processes of one local stack."""

    log_dir: Path
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    redis: LocalRedis | None = None

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        # The child keeps its own copy of the descriptor; ours closes at once.
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.children.append((name, proc))

    def dead(self) -> list[str]:
        return [name for name, p in self.children if p.poll() is not None]

    def stop(self) -> None:
        for _, proc in self.children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for _, proc in self.children:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.redis is not None:
            self.redis.stop()


@dataclass(frozen=True)
class UpOptions:
    port: int
    redis_url: str | None
    workers: int
    flower: bool
    flower_port: int
    models: str
    state_dir: Path


def start_stack(opts: UpOptions) -> tuple[Stack, dict[str, str]]:
    """Start everything; returns the stack and the URLs to print."""
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    url, local = choose_redis(opts.redis_url, opts.state_dir / "redis")
    stack = Stack(opts.state_dir, redis=local)
    env = dict(os.environ, CARPOOL_REDIS_URL=url, CARPOOL_WEB_BIND=f"127.0.0.1:{opts.port}")
    if opts.models:
        env["CARPOOL_MODELS"] = opts.models
    stack.spawn("web", web_command(), env)
    metrics_port = int(env.get("CARPOOL_WORKER_METRICS_PORT") or DEFAULT_WORKER_METRICS_PORT)
    for i in range(opts.workers):
        # One host, several workers: each its own metrics port (9100, 9101, ...; 0 stays off).
        port = str(metrics_port + i if metrics_port else 0)
        # Loopback, like the web and Flower here: a laptop's metrics are its own.
        stack.spawn(f"worker{i}", worker_command(i), {
            "CARPOOL_WORKER_METRICS_ADDR": "127.0.0.1", **env,
            "CARPOOL_WORKER_METRICS_PORT": port})
    urls = {"api": f"http://127.0.0.1:{opts.port}", "redis": url}
    if opts.flower:
        stack.spawn("flower", flower_command(opts.flower_port), env)
        urls["flower"] = f"http://127.0.0.1:{opts.flower_port}"
    return stack, urls


def redis_is_up(url: str) -> bool:
    return answers(url)
