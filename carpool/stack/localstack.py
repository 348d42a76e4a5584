"""`carpool up`: Redis, gunicorn, N Celery workers (or MIN..MAX, scaled by need:
carpool/stack/autoscaler.py), the webhook dispatcher and Flower, supervised (a child
that exits is restarted: carpool/stack/supervisor.py) and stopped cleanly on Ctrl-C."""

from __future__ import annotations

import base64
import errno
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from carpool.core.errors import ConfigError
from carpool.core.settings import DEFAULT_WORKER_METRICS_PORT
from carpool.stack.command_lines import python_argv
from carpool.stack.redis_local import LocalRedis, choose_redis, free_port
from carpool.stack.scaling import Bounds
from carpool.stack.supervisor import Child, Supervisor

#: Beyond the children's own graces (``stop_grace_s``), for their exit itself.
STOP_MARGIN_S = 5.0
#: gunicorn's graceful timeout past the longest long-poll (web/gunicorn_conf.py).
WEB_STOP_SLACK_S = 10.0
#: CARPOOL_STOP_GRACE_S's and CARPOOL_MAX_WAIT_S's defaults (carpool/core/settings.py).
DEFAULT_STOP_GRACE_S, DEFAULT_MAX_WAIT_S = 45.0, 60.0
#: The ports `carpool up` takes unless told otherwise (a taken one is replaced).
DEFAULT_WEB_PORT, DEFAULT_FLOWER_PORT = 8000, 5555
#: The dispatcher's and the feeder's metrics ports (their settings' defaults).
DEFAULT_DISPATCH_PORT, DEFAULT_FEEDER_PORT = 9300, 9400


# The shipped command lines (carpool/stack/commands.toml), run by this interpreter.
def web_command() -> list[str]:
    return python_argv("web")


def worker_command(index: int) -> list[str]:
    return [*python_argv("worker", node=f"worker{index}@%h"), "--loglevel", "INFO"]


#: Flower's task list: each batch's (model, bin, size) and its result beside its runtime.
FLOWER_TASKS_COLUMNS = "name,uuid,state,args,result,received,started,runtime,worker"


def dispatcher_command() -> list[str]:
    return python_argv("dispatcher")


def flower_command(port: int) -> list[str]:
    return [*python_argv("flower", port=port), "--address=127.0.0.1",
            f"--tasks_columns={FLOWER_TASKS_COLUMNS}"]


def port_problem(port: int) -> str | None:
    """Why 127.0.0.1:``port`` cannot be listened on now, or None if it can."""
    with socket.socket() as s:
        # As gunicorn binds: a connection of a stack just stopped (TIME_WAIT, a minute)
        # must not refuse the restart.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} is already in use by another process"
            return f"port {port} cannot be listened on: {exc.strerror or exc}"
    return None


def pick_port(wanted: int | None, default: int, what: str, notes: list[str]) -> int:
    """``wanted`` if given (an error names why it cannot be used); else ``default``,
    or a free port when that one is taken (noted for the user)."""
    if wanted == 0:
        return free_port()  # 0: any free port, chosen here so the URLs printed are true
    if wanted is not None:
        problem = port_problem(wanted)
        if problem:
            raise ConfigError(f"{what}: {problem}; pick another with the option, or leave "
                              "it out to let carpool up choose a free one")
        return wanted
    if port_problem(default) is None:
        return default
    port = free_port()
    notes.append(f"{what}: port {default} is taken, using {port}")
    return port


class Stoppable(Protocol):
    def stop(self) -> None: ...


@dataclass
class Stack:
    """The processes of one local stack."""

    log_dir: Path
    supervisor: Supervisor = field(default_factory=Supervisor)
    redis: LocalRedis | None = None
    #: The environment the children share, and the workers' node names ("worker0", ...):
    #: `carpool up` reads their registry entries (carpool/stack/readiness.py).
    env: dict[str, str] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)
    #: What the workers add to ``env`` (CARPOOL_GPU_CLAIM=1 for a pool on GPUs).
    worker_env: dict[str, str] = field(default_factory=dict)
    #: The pool's size, MIN..MAX (capped at one worker per GPU).
    bounds: Bounds = Bounds(1, 1)

    #: Started once the first workers registered, with --workers MIN..MAX (autoscaler.py).
    scaler: Stoppable | None = None

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.supervisor.add(Child(name, cmd, env, self.log_dir / f"{name}.log"))

    def spawn_worker(self, notes: list[str]) -> str:
        """One more worker, named after the lowest index no child of ours holds (node
        names and metrics ports stay small and unique); its name."""
        taken = {c.name for c in self.supervisor.children} | set(self.workers)
        index = next(i for i in range(len(taken) + 1) if f"worker{i}" not in taken)
        name = f"worker{index}"
        base = int(self.env.get("CARPOOL_WORKER_METRICS_PORT") or DEFAULT_WORKER_METRICS_PORT)
        port = pick_port(None, base + index, f"{name} metrics", notes) if base else 0
        # Loopback, like the web and Flower here: a laptop's metrics are its own.
        self.spawn(name, worker_command(index), {
            "CARPOOL_WORKER_METRICS_ADDR": "127.0.0.1", **self.env, **self.worker_env,
            "CARPOOL_WORKER_METRICS_PORT": str(port)})
        self.workers.append(name)
        return name

    def retire_worker(self, name: str) -> None:
        """A warm shutdown (supervisor.py, ``retire``); the worker leaves the pool now."""
        self.supervisor.retire(name)
        self.workers.remove(name)

    def stop(self) -> None:
        if self.scaler is not None:
            self.scaler.stop()
        self.supervisor.stop()
        procs = [c.proc for c in self.supervisor.children if c.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + stop_grace_s(self.env)
        try:
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
        finally:  # Redis last, whatever happened above: the children write to it
            if self.redis is not None:
                self.redis.stop()


def stop_grace_s(env: Mapping[str, str]) -> float:
    """How long the children may take to stop: a worker finishes its batch in hand
    (``CARPOOL_STOP_GRACE_S``), the web its longest long-poll (``CARPOOL_MAX_WAIT_S``,
    gunicorn's graceful timeout: web/gunicorn_conf.py)."""
    # Read alone, not through load_settings: a stack whose catalogue is broken (a child
    # in a crash loop over it) must still stop.
    return max(_seconds(env, "CARPOOL_STOP_GRACE_S", DEFAULT_STOP_GRACE_S),
               _seconds(env, "CARPOOL_MAX_WAIT_S", DEFAULT_MAX_WAIT_S) + WEB_STOP_SLACK_S
               ) + STOP_MARGIN_S


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """``env[name]`` in seconds; ``default`` when absent or unreadable (as the children's
    settings would refuse it)."""
    try:
        value = float(env.get(name, default))
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


@dataclass(frozen=True)
class UpOptions:
    port: int | None
    redis_url: str | None
    workers: Bounds
    flower: bool
    flower_port: int | None
    models: str
    state_dir: Path


def gpu_count() -> int:
    """The host's GPUs, as nvidia-smi lists them (0 without it)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def pool_bounds(bounds: Bounds, env: dict[str, str], gpus: int, notes: list[str]
                ) -> tuple[Bounds, dict[str, str]]:
    """A scaling pool on a host with GPUs: one worker per GPU at most, each claiming its
    own by a lease (worker/device/gpu.py); the bounds and the workers' extra settings."""
    if not bounds.scaling or gpus <= 0:
        return bounds, {}
    extra = {} if env.get("CARPOOL_GPU_CLAIM") else {"CARPOOL_GPU_CLAIM": "1"}
    if bounds.high > gpus:
        notes.append(f"--workers {bounds.low}..{bounds.high}: {gpus} GPU(s), so at most "
                     f"{max(gpus, bounds.low)} workers")
        bounds = Bounds(bounds.low, max(gpus, bounds.low))
    return bounds, extra


def _spawn_dispatcher(stack: Stack, env: dict[str, str], notes: list[str]) -> None:
    """The webhook dispatcher, signing with CARPOOL_WEBHOOK_SECRET, or with a fresh secret
    of this run's (noted, so a local receiver can verify)."""
    extra = {"CARPOOL_WORKER_METRICS_ADDR": "127.0.0.1",
             "CARPOOL_DISPATCH_METRICS_PORT": str(pick_port(
                 None, int(env.get("CARPOOL_DISPATCH_METRICS_PORT") or DEFAULT_DISPATCH_PORT),
                 "dispatcher metrics", notes))}
    if not env.get("CARPOOL_WEBHOOK_SECRET"):
        secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
        extra["CARPOOL_WEBHOOK_SECRET"] = secret
        notes.append(f"webhooks are signed with CARPOOL_WEBHOOK_SECRET={secret} "
                     "(this run's; set the variable to keep one)")
    stack.spawn("dispatcher", dispatcher_command(), {**env, **extra})


def start_stack(opts: UpOptions) -> tuple[Stack, dict[str, str], list[str]]:
    """Start everything; returns the stack, the URLs to print and notes on ports."""
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    web_port = pick_port(opts.port, DEFAULT_WEB_PORT, "web (--port)", notes)
    flower_port = (pick_port(opts.flower_port, DEFAULT_FLOWER_PORT, "Flower (--flower-port)",
                             notes) if opts.flower else 0)
    url, local = choose_redis(opts.redis_url, opts.state_dir / "redis")
    stack = Stack(opts.state_dir, redis=local)
    try:
        return _started(stack, opts, url, web_port, flower_port, notes)
    except BaseException:  # Ctrl-C, a child that cannot be spawned: nothing left running
        stack.stop()
        raise


def _started(stack: Stack, opts: UpOptions, url: str, web_port: int, flower_port: int,
             notes: list[str]) -> tuple[Stack, dict[str, str], list[str]]:
    env = dict(os.environ, CARPOOL_REDIS_URL=url, CARPOOL_WEB_BIND=f"127.0.0.1:{web_port}")
    if opts.models:
        env["CARPOOL_MODELS"] = opts.models
    # Batch files live under the state folder unless the environment names a folder
    # or a bucket; the web and the feeder must agree.
    if not env.get("CARPOOL_FILES_DIR"):
        env["CARPOOL_FILES_DIR"] = str((opts.state_dir / "files").absolute())
    stack.env = env
    stack.spawn("web", web_command(), env)
    stack.bounds, stack.worker_env = pool_bounds(opts.workers, env, gpu_count(), notes)
    for _ in range(stack.bounds.low):
        stack.spawn_worker(notes)
    _spawn_dispatcher(stack, env, notes)
    stack.spawn("feeder", python_argv("feeder"), {  # runs bulk batches
        "CARPOOL_WORKER_METRICS_ADDR": "127.0.0.1", **env,
        "CARPOOL_FEEDER_METRICS_PORT": str(pick_port(
            None, int(env.get("CARPOOL_FEEDER_METRICS_PORT") or DEFAULT_FEEDER_PORT),
            "feeder metrics", notes))})
    urls = {"api": f"http://127.0.0.1:{web_port}", "redis": url}
    if opts.flower:
        stack.spawn("flower", flower_command(flower_port), env)
        urls["flower"] = f"http://127.0.0.1:{flower_port}"
    stack.supervisor.start()
    return stack, urls, notes

