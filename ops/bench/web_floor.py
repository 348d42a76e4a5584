"""The web's floor: CPU per request of gunicorn (gevent, 2 workers) serving an app that
does nothing, beside ``web_cpu.py``'s figures for carpool's routes.

    python ops/bench/web_floor.py --requests 6000 --clients 64 --rounds 3

Three apps take the same ``POST /submit`` body that ``web_cpu.py`` sends and answer a
small JSON document: ``wsgi``, a bare WSGI function (what gunicorn and gevent cost:
parsing, the sockets, the greenlets); ``werkzeug``, the same with werkzeug's ``Request``
parsing it (what the lean routes keep, web/common/lean.py); and ``flask``, one Flask
route with ``request.get_json`` and ``jsonify`` (what Flask's dispatch adds). No Redis,
no validation, no metrics. Rounds alternate the apps, so a drift of the machine's load
falls on all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from flask import Flask, Response, jsonify, request
from werkzeug.wrappers import Request as WzRequest

from carpool.bench.httpclient import HttpClient
from carpool.stack.redis_local import free_port
from carpool.stack.waiting import wait_until

BODY = json.dumps({"model": "synthetic", "input": {"value": 1, "size": 8}}).encode()
ANSWER = {"id": "AAAA" + "a" * 22, "status": "done", "result": {"value": 1, "size": 8}}
APPS = {"wsgi": "web_floor:wsgi_app", "werkzeug": "web_floor:werkzeug_app",
        "flask": "web_floor:flask_app"}
START_S = 30.0


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    environ["wsgi.input"].read()
    body = json.dumps(ANSWER).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]


def werkzeug_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    req = WzRequest(environ)
    doc = json.loads(req.get_data())
    body = json.dumps({**ANSWER, "model": doc["model"]}).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]


flask_app = Flask(__name__)


@flask_app.post("/submit")
def submit() -> tuple[Response, int]:
    doc = request.get_json()
    return jsonify({**ANSWER, "model": doc["model"]}), 200


async def drive(port: int, requests: int, clients: int) -> None:
    http = HttpClient(f"http://127.0.0.1:{port}", max_connections=clients)
    todo = iter(range(requests))

    async def client() -> None:
        for _ in todo:
            answer = await http.request("POST", "/submit", BODY)
            assert answer.status == 200, answer.status

    await asyncio.gather(*(client() for _ in range(clients)))
    http.close()


def tree_cpu_s(pid: int) -> float:
    root = psutil.Process(pid)
    return float(sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)]))


def measure(app: str, args: argparse.Namespace) -> float:
    """CPU per request (ms) of gunicorn's process tree serving ``app``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-k", "gevent", "-w", "2", "--worker-connections",
         "5000", "-b", f"127.0.0.1:{port}", "--pythonpath", str(Path(__file__).parent),
         APPS[app]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _answers(port), START_S, "gunicorn to answer")
        asyncio.run(drive(port, args.clients * 20, args.clients))  # warm up
        cpu0 = tree_cpu_s(proc.pid)
        asyncio.run(drive(port, args.requests, args.clients))
        return float((tree_cpu_s(proc.pid) - cpu0) / args.requests * 1000)
    finally:
        proc.terminate()
        proc.wait()


def _answers(port: int) -> bool:
    try:
        asyncio.run(drive(port, 1, 1))
    except OSError:
        return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rows: dict[str, list[float]] = {app: [] for app in APPS}
    for _ in range(args.rounds):
        for app in APPS:
            rows[app].append(measure(app, args))
    print(f"{args.requests} requests x {args.rounds} rounds, {args.clients} clients, "
          f"{time.strftime('%Y-%m-%d')}")
    for app, runs in rows.items():
        print(f"{app}: web CPU per request (ms) " + ", ".join(f"{r:.3f}" for r in runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
