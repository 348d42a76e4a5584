"""CPU of a shed submit (503 overloaded) against a served one and against /healthz.

    python ops/bench/shed_cost.py --requests 3000 --rounds 3

One web app in this process, driven by Flask's test client (no gunicorn, no
sockets), on a private redis-server. Each round builds a fresh app on its own key
prefix and times ``--requests`` requests of each kind in turn with
``time.process_time``: this process's CPU, so Redis's own share of a submit is not
in it. The test client's own cost (building the environ, reading the answer) is in
every kind alike: /healthz shows that floor.

    healthz  GET /healthz
    submit   POST /submit, a synthetic job, admitted (202)
    shed     POST /submit with an X-Request-Start an hour old (503, before the body)
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from carpool.core.settings import load_settings
from carpool.stack.redis_local import start_redis
from web import create_app
from web.common.state import EXTENSION

KINDS = ("healthz", "submit", "shed")
BODY = {"model": "synthetic", "input": {"value": 0, "size": 1}}


def request_of(kind: str) -> Callable[[FlaskClient], TestResponse]:
    if kind == "healthz":
        return lambda c: c.get("/healthz")
    if kind == "submit":
        return lambda c: c.post("/submit", json=BODY)
    old = {"X-Request-Start": f"t={time.time() - 3600:.3f}"}
    return lambda c: c.post("/submit", json=BODY, headers=old)


def one_round(redis_url: str, n: int) -> dict[str, tuple[float, Counter[int]]]:
    """µs of CPU per request and the statuses answered, by kind."""
    env = {"CARPOOL_REDIS_URL": redis_url, "CARPOOL_KEY_PREFIX": f"shed{time.time_ns()}"}
    app = create_app(load_settings(env))
    client = app.test_client()
    out: dict[str, tuple[float, Counter[int]]] = {}
    try:
        for kind in KINDS:
            send = request_of(kind)
            for _ in range(min(100, n)):  # warm: first-call imports and caches out of the count
                send(client)
            statuses: Counter[int] = Counter()
            t0 = time.process_time()
            for _ in range(n):
                statuses[send(client).status_code] += 1
            out[kind] = ((time.process_time() - t0) / n * 1e6, statuses)
    finally:
        app.extensions[EXTENSION].close()  # the listener thread and Redis connections
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="carpool-shed-cost-"))
    server = start_redis(tmp / "redis")
    try:
        for r in range(args.rounds):
            costs = one_round(server.url, args.requests)
            line = "  ".join(f"{kind} {us:6.1f} µs {dict(st)}" for kind, (us, st) in costs.items())
            shed_share = costs["shed"][0] / costs["submit"][0]
            print(f"round {r + 1}: {line}  shed/submit {shed_share:.2f}")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
