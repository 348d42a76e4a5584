"""Web CPU to refuse a burst of submits that waited in the accept queue, old code
against new, under real gunicorn.

    python ops/bench/shed_burst.py --roots /path/to/old,. --burst 500 --rounds 3

For each checkout in ``--roots`` (``python -m gunicorn`` from that root imports that
root's code) and each round: a private redis-server, the web with one gevent worker
and a 300 ms shed bound; the worker is stopped (SIGSTOP) while ``--burst`` new
connections each send a whole ``POST /submit``, for 0.5 s (past the bound), then let
go. Every submit is refused 503 ``overloaded``; the figures are the worker's CPU from
the stop until the last answer is read, per refusal, and the time from letting it go
to the last answer. A refusal in the accept loop
(web/common/accept_shedding.py) skips gunicorn's parse and greenlet; one in front of
Flask has both.

``--kept-alive``: each connection is kept alive instead. It reads one answer before
the stop, sends a ``GET /healthz`` during it (KEPT_STALL_S, so the lag lasts), and
sends its submit once that answer is read; the figures count from the last
``/healthz`` answer read: a refusal of the next request on a kept-alive connection
(web/common/keepalive_shedding.py, or in front of Flask).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import requests

from carpool.stack.command_lines import python_argv
from carpool.stack.redis_local import free_port, start_redis
from carpool.stack.waiting import wait_until

BOUND_MS = 300
STALL_S = 0.5
#: The kept-alive stall: its lag passes half the bound for about 0.3 s after it, and
#: it is shorter than gunicorn's keep-alive timeout (2 s), which would close the idle
#: connections as the worker resumes.
KEPT_STALL_S = 1.5
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"
BODY = json.dumps({"model": "synthetic", "input": {"value": 0, "size": 1}}).encode()
SUBMIT = (b"POST /submit HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
          + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)


def answer_status(s: socket.socket) -> str:
    out = bytearray()
    while b"\r\n" not in out and (chunk := s.recv(4096)):
        out += chunk
    return out.split(b" ", 2)[1].decode() if out else "closed"


def cpu_s(pid: int) -> float:
    """The CPU seconds of ``pid``'s threads, to the nanosecond (``/proc``'s schedstat;
    its stat counts 10 ms ticks, coarse beside a burst's few tens of ms)."""
    tasks = Path(f"/proc/{pid}/task")
    return sum(int((task / "schedstat").read_text().split()[0])
               for task in tasks.iterdir()) / 1e9


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def read_answer(s: socket.socket) -> str:
    """The status of one answer on a kept-alive connection, its body read out."""
    out = bytearray()
    while b"\r\n\r\n" not in out and (chunk := s.recv(4096)):
        out += chunk
    head, _, body = bytes(out).partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (chunk := s.recv(4096)):
        body += chunk
    return head.split(b" ", 2)[1].decode() if head else "closed"


def one_round(root: Path, redis_url: str, burst: int, kept_alive: bool = False
              ) -> tuple[float, float, Counter[str]]:
    """(ms of web CPU per refusal, ms from the worker's resumption to the last answer,
    the statuses answered)."""
    port = free_port()
    env = dict(os.environ, CARPOOL_REDIS_URL=redis_url, CARPOOL_WEB_BIND=f"127.0.0.1:{port}",
               CARPOOL_KEY_PREFIX=f"burst{time.time_ns()}", CARPOOL_MODELS="synthetic",
               CARPOOL_WEB_WORKERS="1", CARPOOL_WEB_MAX_QUEUE_MS=str(BOUND_MS))
    web = subprocess.Popen(python_argv("web"), cwd=root, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(base), 60, "web start")
        (worker,) = psutil.Process(web.pid).children()
        cpu0 = cpu_s(worker.pid)
        socks: list[socket.socket] = []
        if kept_alive:  # connected and served before the stop
            socks = [connect(port) for _ in range(burst)]
            for s in socks:
                s.sendall(HEALTHZ)
                read_answer(s)
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            socks = socks or [connect(port) for _ in range(burst)]
            for s in socks:
                s.sendall(HEALTHZ if kept_alive else SUBMIT)
            # The wait being measured against, not a wait for work.
            time.sleep(KEPT_STALL_S if kept_alive else STALL_S)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
            resumed = time.perf_counter()
        if kept_alive:
            for s in socks:
                read_answer(s)
            cpu0 = cpu_s(worker.pid)
            resumed = time.perf_counter()
            for s in socks:
                s.sendall(SUBMIT)
        statuses = Counter((read_answer if kept_alive else answer_status)(s) for s in socks)
        drained_ms = (time.perf_counter() - resumed) * 1e3
        used_s = cpu_s(worker.pid) - cpu0
        for s in socks:
            s.close()
        return used_s / burst * 1e3, drained_ms, statuses
    finally:
        web.terminate()
        web.wait(timeout=30)


def _up(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).ok
    except requests.RequestException:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roots", default=".", help="comma-separated checkouts to compare")
    ap.add_argument("--burst", type=int, default=500, help="connections per burst")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kept-alive", action="store_true",
                    help="refuse the next request of kept-alive connections instead")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="carpool-shed-burst-"))
    server = start_redis(tmp / "redis")
    try:
        for r in range(args.rounds):
            for root in args.roots.split(","):
                ms, drained_ms, statuses = one_round(Path(root).resolve(), server.url,
                                                     args.burst, args.kept_alive)
                since = "the submits were sent" if args.kept_alive else "the worker resumed"
                print(f"round {r + 1} {root}: {ms:.3f} ms web CPU per refusal, all answered "
                      f"{drained_ms:.0f} ms after {since} {dict(statuses)}")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
