"""Hostile load on a real web tier, and what the defences cost on the hot path.

    python ops/bench/hostile.py attack --repo /path/to/checkout   # 4,100 + 4,100 sockets
    python ops/bench/hostile.py cost --repo /path/to/checkout     # web CPU per job

``--repo`` picks the code under test (its ``web`` and ``carpool`` packages; run
twice, once per checkout, to compare). Each run starts a private redis-server and
a real gunicorn with the shipped settings.

``attack``: a probe asks ``GET /healthz`` and ``POST /submit`` every
PROBE_INTERVAL_S and records each answer's latency (PROBE_TIMEOUT_S: no answer).
Meanwhile, phase 1 opens SOCKETS connections that send a submit's headers and one
byte of its 100-byte body, and holds them HOLD_S; phase 2 sends SOCKETS
``GET /result/<id>?wait=60`` on a queued job and drops each at once, then watches
HOLD_S. Prints the slowest probe answers per phase.

``cost``: web CPU (all gunicorn processes) per submit and per result read, from
JOBS submits then JOBS reads of queued jobs, over CLIENTS threads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import redis
import requests

from carpool.stack.command_lines import python_argv
from carpool.stack.redis_local import free_port, start_redis

SOCKETS = 4100
#: How long phase 1 holds its slow bodies: past the 10 s body time limit.
HOLD_S = 15.0
PROBE_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 10.0
#: The done-when bound of the issue: each probe answers within this.
ANSWER_BOUND_S = 3.0
START_TIMEOUT_S = 60.0


def start_web(repo: Path, redis_url: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(repo), CARPOOL_REDIS_URL=redis_url,
               CARPOOL_WEB_BIND=f"127.0.0.1:{port}", CARPOOL_KEY_PREFIX="hostile")
    log = open(tmp / "web.log", "ab")  # noqa: SIM115 — the process's, closed with it
    web = subprocess.Popen(python_argv("web"), env=env, cwd=repo, stdout=log,
                           stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _ok(f"{base}/healthz"):
        if time.monotonic() > deadline or web.poll() is not None:
            raise RuntimeError(f"web did not start; see {tmp / 'web.log'}")
        time.sleep(0.1)
    return web, base


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


class Probe(threading.Thread):
    """Asks /healthz and /submit every PROBE_INTERVAL_S; keeps (phase, what, latency)."""

    def __init__(self, base: str, web_pid: int) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.web = psutil.Process(web_pid)
        self.peak_rss_mb = 0.0
        self.phase = "idle"
        self.phase_t0 = time.monotonic()
        self.samples: list[tuple[str, str, float, int]] = []
        self.slowest: list[tuple[float, str, str, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        body = {"model": "synthetic", "input": {"value": "probe", "size": 1}}
        while not self.stopping.wait(PROBE_INTERVAL_S):
            with _quiet():
                rss = sum(p.memory_info().rss for p in [self.web, *self.web.children()])
                self.peak_rss_mb = max(self.peak_rss_mb, rss / (1 << 20))
            calls: tuple[tuple[str, Callable[[], requests.Response]], ...] = (
                ("healthz", lambda: requests.get(f"{self.base}/healthz",
                                                 timeout=PROBE_TIMEOUT_S)),
                ("submit", lambda: requests.post(f"{self.base}/submit", json=body,
                                                 timeout=PROBE_TIMEOUT_S)))
            for what, call in calls:
                t0 = time.monotonic()
                try:
                    status = call().status_code
                except requests.RequestException:
                    status = 0
                latency = time.monotonic() - t0
                self.samples.append((self.phase, what, latency, status))
                self.slowest.append((round(latency, 3), self.phase, what,
                                     round(t0 - self.phase_t0, 1)))

    def enter(self, phase: str) -> None:
        self.phase, self.phase_t0 = phase, time.monotonic()


def _connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S)
    except OSError:
        return None


def attack(repo: Path) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * SOCKETS + 1000), hard))
    tmp = Path(tempfile.mkdtemp(prefix="carpool-hostile-"))
    server = start_redis(tmp / "redis")
    web, base = start_web(repo, server.url, tmp)
    port = int(base.rsplit(":", 1)[1])
    probe = Probe(base, web.pid)
    try:
        probe.start()
        time.sleep(2 * PROBE_INTERVAL_S)  # a few idle samples first
        probe.enter("slow bodies")
        slow = [s for s in (_connect(port) for _ in range(SOCKETS)) if s is not None]
        for s in slow:
            with _quiet():
                s.sendall(b"POST /submit HTTP/1.1\r\nHost: h\r\nContent-Type: application/json"
                          b"\r\nContent-Length: 100\r\n\r\n{")
        opened_slow = len(slow)
        time.sleep(HOLD_S)
        for s in slow:
            s.close()
        probe.enter("dropped polls")
        job = requests.post(f"{base}/submit", json={"model": "synthetic", "input": {
            "value": 0, "size": 1}}, timeout=PROBE_TIMEOUT_S).json()["id"]
        t0 = time.monotonic()
        sent = 0
        for _ in range(SOCKETS):
            conn = _connect(port)
            if conn is None:
                continue
            with _quiet():
                conn.sendall(f"GET /result/{job}?wait=60 HTTP/1.1\r\nHost: h\r\n\r\n".encode())
                sent += 1
            conn.close()
        drop_s = time.monotonic() - t0
        time.sleep(HOLD_S)
    finally:
        probe.stopping.set()
        probe.join()
        web.terminate()
        web.wait(60)
        server.stop()
    return {"slow_bodies_opened": opened_slow, "polls_sent_and_dropped": sent,
            "drop_s": round(drop_s, 2), "web_peak_rss_mb": round(probe.peak_rss_mb),
            "by_phase": _summary(probe.samples),
            "slowest (latency s, phase, probe, s into phase)": sorted(probe.slowest)[-5:]}


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(
            exc[0], OSError | psutil.Error)  # type: ignore[arg-type]


def _summary(samples: list[tuple[str, str, float, int]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase, what, latency, status in samples:
        row = out.setdefault(phase, {}).setdefault(what, {"n": 0, "max_s": 0.0, "over_3s": 0,
                                                           "statuses": {}})
        row["n"] += 1
        row["max_s"] = round(max(row["max_s"], latency), 3)
        row["over_3s"] += latency > ANSWER_BOUND_S or status == 0
        row["statuses"][str(status)] = row["statuses"].get(str(status), 0) + 1
    return out


def cost(repo: Path, jobs: int, clients: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="carpool-hostile-cost-"))
    server = start_redis(tmp / "redis")
    web, base = start_web(repo, server.url, tmp)
    try:
        web_ps = psutil.Process(web.pid)

        def submit(chunk: range) -> list[str]:
            with requests.Session() as s:
                return [s.post(f"{base}/submit", json={"model": "synthetic", "input": {
                    "value": i, "size": 8}}).json()["id"] for i in chunk]

        def read(ids: list[str]) -> int:
            with requests.Session() as s:
                return sum(s.get(f"{base}/result/{i}").status_code == 200 for i in ids)

        submit(range(50))  # warm-up: scripts loaded, connections made
        r = redis.Redis.from_url(server.url)
        redis0 = _redis_cpu_s(r)
        cpu0 = _tree_cpu_s(web_ps)
        with ThreadPoolExecutor(clients) as pool:
            ids = [i for part in pool.map(submit, [range(c, jobs, clients)
                                                   for c in range(clients)]) for i in part]
        cpu1 = _tree_cpu_s(web_ps)
        redis1 = _redis_cpu_s(r)
        with ThreadPoolExecutor(clients) as pool:
            read_ok = sum(pool.map(read, [ids[c::clients] for c in range(clients)]))
        cpu2 = _tree_cpu_s(web_ps)
        redis2 = _redis_cpu_s(r)
    finally:
        web.terminate()
        web.wait(60)
        server.stop()
    return {"jobs": len(ids), "reads_ok": read_ok,
            "web_cpu_ms_per_submit": round(1000 * (cpu1 - cpu0) / len(ids), 3),
            "web_cpu_ms_per_result_read": round(1000 * (cpu2 - cpu1) / len(ids), 3),
            "redis_cpu_us_per_submit": round(1e6 * (redis1 - redis0) / len(ids), 1),
            "redis_cpu_us_per_result_read": round(1e6 * (redis2 - redis1) / len(ids), 1)}


def _redis_cpu_s(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _tree_cpu_s(proc: psutil.Process) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("attack", "cost"))
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    repo = args.repo.resolve()
    report = attack(repo) if args.what == "attack" else cost(repo, args.jobs, args.clients)
    print(json.dumps({"repo": str(repo), args.what: report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
