"""`carpool up` keeps its children running: real processes, a real stack."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from carpool.stack.supervisor import Child, Supervisor
from tests.support.procs import REPO_ROOT, free_port, log_says, wait_until
from tests.support.redisproc import private_redis

CRASHING = [sys.executable, "-c", "import sys; print('boom: no such file'); sys.exit(3)"]


def test_a_child_that_keeps_exiting_is_restarted_then_stopped_as_a_crash_loop(
        tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(say=said.append, backoff_first_s=0.01)
    supervisor.add(Child("crasher", CRASHING, dict(os.environ), tmp_path / "crasher.log"))
    supervisor.start()
    try:
        assert supervisor.failed.wait(30)
    finally:
        supervisor.stop()
    assert supervisor.failure is not None
    assert "crasher exited with code 3, its 5th exit" in supervisor.failure
    assert "boom: no such file" in supervisor.failure  # the child's own last words
    restarts = [line for line in said if line.startswith("crasher restarted")]
    assert len(restarts) == 4 and "restart #4" in restarts[-1]
    assert said[0].startswith("crasher exited with code 3; restarting in")


def test_a_busy_port_given_to_carpool_up_is_refused_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "carpool.cli", "up", "--port", str(port), "--once",
             "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60,
            cwd=REPO_ROOT)
    assert proc.returncode == 2
    assert f"port {port} is already in use" in proc.stderr


@contextmanager
def carpool_up(args: list[str], env: dict[str, str], out: Path
               ) -> Iterator[subprocess.Popen[bytes]]:
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "carpool.cli", "up", *args],
                                env={**os.environ, **env}, cwd=REPO_ROOT, stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def child_pid(parent: int, name_part: str) -> int:
    """The pid of ``parent``'s child whose command line holds ``name_part``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and name_part in cmdline:
            return int(entry.name)
    raise LookupError(f"no child of {parent} runs {name_part!r}")


def readies(log: Path) -> int:
    """How many times a worker logged that it is ready (each start once)."""
    return log.read_text(errors="replace").count(" ready.") if log.exists() else 0


def submit(base: str, values: range) -> list[str]:
    return [requests.post(f"{base}/submit", timeout=10, json={
        "model": "synthetic", "input": {"value": v, "size": 1}}).json()["id"] for v in values]


def done(base: str, job_id: str) -> bool:
    view = requests.get(f"{base}/result/{job_id}?wait=5", timeout=15).json()
    return bool(view["status"] == "done")


def test_a_worker_killed_under_carpool_up_is_replaced_and_every_job_completes(
        tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "up.out"
    with private_redis() as redis_server, carpool_up(
            ["--workers", "2", "--no-flower", "--port", str(port), "--redis-url",
             redis_server.url, "--state-dir", str(tmp_path / "state")],
            {"CARPOOL_MODELS": "synthetic", "CARPOOL_KEY_PREFIX": "up-supervised",
             "CARPOOL_LEASE_MS": "3000",
             "CARPOOL_WORKER_METRICS_PORT": str(free_port())}, out) as up:
        wait_until(lambda: up.poll() is not None or log_says(out, "carpool is up"), 120,
                   "carpool up to be up")
        assert up.poll() is None, out.read_text()
        base = f"http://127.0.0.1:{port}"
        worker_log = tmp_path / "state" / "worker0.log"
        wait_until(lambda: readies(worker_log) == 1, 60, "worker0 to be ready")
        before = submit(base, range(20))
        os.kill(child_pid(up.pid, "worker0@"), signal.SIGKILL)
        wait_until(lambda: log_says(out, "worker0 restarted (restart #1"), 60,
                   "the replacement worker")
        wait_until(lambda: readies(worker_log) == 2, 60, "the replacement to be ready")
        after = submit(base, range(20, 40))
        for job_id in before + after:  # the killed worker's batch: back after its lease
            wait_until(lambda: done(base, job_id), 60, f"job {job_id} to be done")  # noqa: B023
        assert up.poll() is None  # the stack kept serving
    assert "worker0 was killed by signal 9; restarting in" in out.read_text()


def test_carpool_up_demo_names_the_child_that_died_and_quotes_why(tmp_path: Path) -> None:
    with private_redis() as redis_server:
        proc = subprocess.run(
            [sys.executable, "-m", "carpool.cli", "up", "--demo", "--once", "--no-flower",
             "--port", str(free_port()), "--redis-url", redis_server.url,
             "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=300,
            cwd=REPO_ROOT, env={**os.environ, "CARPOOL_MODELS": "synthetic,no-such-model",
                                "CARPOOL_WORKER_METRICS_PORT": "0"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    first_exit = proc.stderr.index("worker0 exited with code")
    assert "no-such-model" in proc.stderr[first_exit:first_exit + 2000]  # its own words
    assert "5th exit within 60 s: stopping (crash loop)" in proc.stderr


def test_a_worker_whose_metrics_port_is_taken_serves_without_it_and_says_so(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    from tests.conftest import make_env
    from tests.support.procs import start_worker

    log = tmp_path / "worker.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = make_env(redis_url, key_prefix, CARPOOL_MODELS="synthetic",
                       CARPOOL_WORKER_METRICS_PORT=str(taken.getsockname()[1]))
        with start_worker(env, "w1@metrics-taken", log_path=log) as worker:
            assert worker.poll() is None
    assert log.read_text().count("serving without a metrics endpoint") == 1


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_second_signal_during_the_stop_neither_cuts_it_short_nor_leaves_children(
        tmp_path: Path) -> None:
    """The second SIGTERM (an impatient operator, a supervisor's escalation) lands while
    the first one's stop waits: no traceback, and every child is gone at the end."""
    port, out = free_port(), tmp_path / "up.out"
    with private_redis() as redis_server, carpool_up(
            ["--workers", "1", "--no-flower", "--port", str(port), "--redis-url",
             redis_server.url, "--state-dir", str(tmp_path / "state")],
            {"CARPOOL_MODELS": "synthetic", "CARPOOL_KEY_PREFIX": "up-twice",
             "CARPOOL_WORKER_METRICS_PORT": str(free_port())}, out) as up:
        wait_until(lambda: up.poll() is not None or log_says(out, "carpool is up"), 120,
                   "carpool up to be up")
        assert up.poll() is None, out.read_text()
        children = [child_pid(up.pid, part) for part in ("gunicorn", "worker0@", "feeder")]
        up.send_signal(signal.SIGTERM)
        wait_until(lambda: log_says(out, "stopping carpool"), 30, "the stop to begin")
        up.send_signal(signal.SIGTERM)
        assert up.wait(120) == 0, out.read_text()
    assert "Traceback" not in out.read_text()
    assert [pid for pid in children if alive(pid)] == []
