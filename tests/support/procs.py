"""Start real processes for end-to-end tests, wait for them with a bound, and stop them.

A process's output goes to a log file (a pipe nobody reads would fill and block
it); when it fails to start, the error shows the log's tail.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from carpool.stack.waiting import wait_until
from tests.support.commands import argv

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
#: A process gets this long to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 15.0
#: gunicorn plus two gevent workers importing Flask and Pillow: about a second here.
WEB_START_TIMEOUT_S = 30.0
#: Characters of a failed process's log shown in the error.
LOG_TAIL_CHARS = 4000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(log_path: Path) -> str:
    text = log_path.read_text(errors="replace")
    return text[-LOG_TAIL_CHARS:] or "(empty log)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


@contextmanager
def running(
    command: list[str], env: Mapping[str, str], ready: Callable[[], bool], what: str,
    timeout_s: float,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` with ``env`` added to this environment until the block ends.

    Waits until ``ready()`` (failing fast if the process exits first), and on the
    way out stops it: SIGTERM, then SIGKILL after STOP_TIMEOUT_S.
    """
    with tempfile.NamedTemporaryFile(prefix=f"{what}-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
        proc = subprocess.Popen(command, env={**os.environ, **env}, cwd=REPO_ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_until(lambda: proc.poll() is not None or ready(), timeout_s, f"{what} to start")
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode} at start")
        except (TimeoutError, RuntimeError) as exc:
            raise RuntimeError(f"{exc}; its log ({log_path}):\n{_tail(log_path)}") from None
        yield proc
    finally:
        _stop(proc)
    log_path.unlink(missing_ok=True)  # kept when the test failed, for a look


def answers(url: str) -> bool:
    """True when GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:  # noqa: S310 — our own URL
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def web_command() -> list[str]:
    """The shipped web command line, with its program taken from this venv."""
    program, *args = argv("web")
    return [str(Path(sys.executable).parent / program), *args]


@contextmanager
def start_web(env: dict[str, str]) -> Iterator[str]:
    """Real gunicorn serving the web app with ``env``; yields its base URL."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {"CARPOOL_WEB_BIND": f"127.0.0.1:{port}", **env}
    with running(web_command(), env, lambda: answers(f"{base_url}/healthz"), "gunicorn",
                 WEB_START_TIMEOUT_S):
        yield base_url


#: A Celery worker importing celery, kombu and the catalogue, then mingling: a few seconds.
WORKER_START_TIMEOUT_S = 60.0


def worker_command(node_name: str) -> list[str]:
    """The shipped worker command line, from this venv, with its own node name."""
    program, *args = argv("worker")
    args = [node_name if a == "worker@%h" else a for a in args]
    return [str(Path(sys.executable).parent / program), *args, "--loglevel", "INFO"]


def _log_says(log_path: Path, text: str) -> bool:
    return log_path.exists() and text in log_path.read_text(errors="replace")


@contextmanager
def start_worker(env: dict[str, str], node_name: str = "w1@carpool-test",
                 log_path: Path | None = None, ready: Callable[[], bool] | None = None,
                 ) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker (`--pool solo`) running the batch loop; yields the process.

    Ready when its log says the node is ready: the bootstep has then started the loop;
    or, given ``ready``, as soon as that is true (a worker still loading its models).
    The log is ``log_path`` when given (and kept, for the test to read), else a temp file.
    Its metrics endpoint is off unless ``env`` sets CARPOOL_WORKER_METRICS_PORT.
    """
    # Off unless a test asks for it: parallel test runs would fight over port 9100.
    env = {"CARPOOL_WORKER_METRICS_PORT": "0", **env}
    keep = log_path is not None
    if log_path is None:
        with tempfile.NamedTemporaryFile(prefix="worker-ready-", suffix=".log",
                                         delete=False) as f:
            log_path = Path(f.name)
    ready_log = log_path
    cmd = [*worker_command(node_name), "--logfile", str(log_path)]
    try:
        with running(cmd, env, ready or (lambda: _log_says(ready_log, f"{node_name} ready.")),
                     "celery", WORKER_START_TIMEOUT_S) as proc:
            yield proc
    finally:
        if not keep:
            log_path.unlink(missing_ok=True)


def log_says(log_path: Path, text: str) -> bool:
    """True once the log at ``log_path`` holds ``text``."""
    return _log_says(log_path, text)



#: A dispatcher imports redis and the catalogue, then serves its metrics: about a second.
DISPATCHER_START_TIMEOUT_S = 30.0


def dispatcher_command() -> list[str]:
    """The shipped dispatcher command line (``python -m dispatcher``), this venv's."""
    _python, *args = argv("dispatcher")
    return [sys.executable, *args]


@contextmanager
def start_dispatcher(env: dict[str, str],
                     port: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A real webhook dispatcher; ready once its metrics endpoint (on ``port``, else a
    free one) answers."""
    port = port or free_port()
    env = {"CARPOOL_DISPATCH_METRICS_PORT": str(port),
           "CARPOOL_WORKER_METRICS_ADDR": "127.0.0.1", **env}
    with running(dispatcher_command(), env,
                 lambda: answers(f"http://127.0.0.1:{port}/metrics"), "dispatcher",
                 DISPATCHER_START_TIMEOUT_S) as proc:
        yield proc


@contextmanager
def open_files_at_least(wanted: int) -> Iterator[None]:
    """Raise this process's soft open-files limit to ``wanted`` (processes it starts
    inherit it), put back afterwards; the test is skipped when the hard limit is lower."""
    import pytest  # only tests call this

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"needs {wanted} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
