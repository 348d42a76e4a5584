"""gunicorn's settings for the web tier.

    gunicorn -c python:web.gunicorn_conf 'web:create_app()'

Environment: ``CARPOOL_WEB_BIND`` (default 127.0.0.1:8000), ``CARPOOL_WEB_WORKERS``
(default: the cores this process may use, ``available_cores``),
``CARPOOL_WEB_WORKER_CONNECTIONS`` (default 5000),
plus everything ``carpool.core.settings.load_settings`` reads.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import tempfile
from pathlib import Path
from typing import Any

from carpool.core.errors import ConfigError
from carpool.core.settings import load_settings

#: Time past the longest long-poll that a graceful stop still waits for requests.
GRACE_MARGIN_S = 10
#: A worker's own files beside its client sockets: Redis connections, metric files, logs.
FDS_PER_WORKER_BESIDES_CLIENTS = 200
#: prometheus_client's multiprocess mode reads this (web/common/metrics.py).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name) or str(default)
    if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
        raise ConfigError(f"{name}={raw!r} must be a positive integer")
    return int(raw)


def available_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota
    (a container's ``cpus:``), rounded up; at least 1.

    The web is CPU-bound (docs/operations.md, sizing): one gevent worker per core.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    quota = _cgroup_quota(cgroup_root)
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def _cgroup_quota(root: Path) -> float | None:
    """CPUs granted by the cgroup's quota (v2 ``cpu.max``, v1 ``cpu.cfs_*``), or None."""
    try:
        if (root / "cpu.max").exists():
            limit, _, period = (root / "cpu.max").read_text().strip().partition(" ")
            return None if limit == "max" else int(limit) / int(period or 100000)
        v1 = root / "cpu"
        if (v1 / "cpu.cfs_quota_us").exists():
            limit_us = int((v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((v1 / "cpu.cfs_period_us").read_text())
            return None if limit_us <= 0 or period_us <= 0 else limit_us / period_us
    except (OSError, ValueError):  # unreadable or odd: go by the affinity alone
        return None
    return None


#: Metric directories made by on_starting, removed by on_exit.
_made_dirs: list[Path] = []


def _metrics_dir() -> tuple[Path, bool]:
    """The directory for every worker's metric files, emptied; True if made here."""
    given = os.environ.get(METRICS_DIR_ENV)
    if not given:
        path = Path(tempfile.mkdtemp(prefix="carpool-metrics-"))
        os.environ[METRICS_DIR_ENV] = str(path)
        return path, True
    path = Path(given)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):  # an earlier run's counts would be summed with ours
        stale.unlink()
    return path, False


def on_starting(server: Any) -> None:
    """In the master, before any worker forks: where /metrics finds every process's counts.

    /metrics must sum gunicorn's worker processes: each counts into its own files
    in one directory, and whichever process a scrape reaches adds them all up.
    Workers inherit the variable before they import prometheus_client (which
    decides its mode on import). A hook, not import time: importing this module
    (tests read its settings) must not change the environment.
    """
    path, made = _metrics_dir()
    if made:
        _made_dirs.append(path)
    _raise_open_files(server)


def _raise_open_files(server: Any) -> None:
    """Let every worker hold its worker_connections sockets (inherited by the forks).

    The soft limit is often 1024: with it, a worker would fail accept() long before
    its slots are used. Raised as far as the hard limit allows; a warning below that.
    """
    needed = worker_connections + FDS_PER_WORKER_BESIDES_CLIENTS  # a limit per process
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if wanted < needed:
        server.log.warning("open files are limited to %d (hard limit), below the %d that "
                           "a worker of %d connections needs: raise `ulimit -n`", hard, needed,
                           worker_connections)


def child_exit(server: Any, worker: Any) -> None:
    """A worker died or was replaced: drop its live gauges (its counts stay summed)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def on_exit(server: Any) -> None:
    for path in _made_dirs:
        shutil.rmtree(path, ignore_errors=True)


# Read (and validated) in the master, so a bad setting stops the start, not each worker.
_settings = load_settings()

bind = os.environ.get("CARPOOL_WEB_BIND") or "127.0.0.1:8000"
# One per core: the web is CPU-bound, and a job's web CPU sizes it (docs/operations.md).
workers = _env_int("CARPOOL_WEB_WORKERS", available_cores())
# gevent, because a long-poll mostly waits: each one is a parked greenlet and an
# event, so a 2-core box holds thousands of `?wait=30` polls and still answers
# submits. The worker monkey-patches threading, so web.results.waiters' lock, events and
# listener thread become greenlet-friendly: that is intended.
worker_class = "gevent"
# Per worker: the most connections it serves at once (long-polls and bodies still
# arriving included); the rest wait in the listen backlog, /healthz among them. So
# there are more slots than slow clients can take before they are let go: bodies
# time out (web/common/bodies.py), dropped polls end within a second and one client holds
# at most CARPOOL_MAX_POLLS_PER_CLIENT polls (web/results/polls.py). Still bounded: an idle
# connection costs a greenlet and a socket, tens of KB.
worker_connections = _env_int("CARPOOL_WEB_WORKER_CONNECTIONS", 5000)
# A graceful stop (SIGTERM) lets the longest allowed long-poll finish first.
graceful_timeout = int(_settings.max_wait_s) + GRACE_MARGIN_S
errorlog = "-"
# No access log by default: one log line costs about as much CPU as a submit here.
accesslog = os.environ.get("CARPOOL_WEB_ACCESS_LOG") or None
# gunicorn 27's control socket lives at one path per user: two gunicorns on one
# host (tests, `carpool up` beside another) would take it from each other, and
# carpool does not use it.
control_socket_disable = True


def post_worker_init(worker: Any) -> None:
    """Check Redis's persistence and eviction settings before this worker serves, and
    start its lag monitor (web/common/shedding.py).

    Here, not in the master: the master must not import redis before a gevent worker
    has monkey-patched. A refusal (CARPOOL_REQUIRE_DURABLE=1) raises before the worker
    counts as booted, and gunicorn halts with "Worker failed to boot".
    """
    from web.app import check_redis_durability
    from web.common.accept_shedding import install_in_worker
    from web.common.shedding import start_lag_monitor

    check_redis_durability(worker.wsgi)
    # This worker's event-loop lag and the accept queue it shares, for shedding.
    start_lag_monitor(worker.wsgi, worker.sockets, worker.cfg.workers)
    install_in_worker(worker)  # refused as accepted, under overload
