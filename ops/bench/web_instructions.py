"""Instructions per ``POST /submit`` in the web's own code: a count that does not move
with the machine's load, for comparing two checkouts on a noisy machine.

    PYTHONPATH=/path/to/checkout python ops/bench/web_instructions.py

Runs this script twice under valgrind's callgrind (``PYTHONHASHSEED=0``): each run
builds the app of the checkout on ``PYTHONPATH``, warms it with 50 submits through
Flask's test client (real Redis at --redis-url, a fresh key prefix), then makes N
more and deletes its keys. The difference between N = --low and N = --high, over
high - low, is the instructions per submit (its keys' clean-up included): imports and
start-up cancel out. Flask, Werkzeug, JSON and
redis-py are in it; gunicorn, gevent and Redis's own work are not (web_cpu.py
measures the web process whole, redis_instructions.py Redis's scripts).

``--route`` picks what the submits name, with a second version of the model declared
in a temporary CARPOOL_CONFIG for all but ``none``:

    none     no version declared: the catalogue as shipped
    plain    version 2 declared, no rollout: every job to version 1
    rollout  a rollout sends 50 % of the jobs that name no version to version 2
    pinned   every submit names ``synthetic@2``
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

WARM_SUBMITS = 50
ROUTES = ("none", "plain", "rollout", "pinned")
#: A second version of the synthetic model; its own pace, the rest inherited.
VERSION_TABLE = "[models.synthetic.versions.2]\nmax_queue_ms = 5000\n"


def submit_many(n: int, redis_url: str, route: str) -> None:
    os.environ["CARPOOL_REDIS_URL"] = redis_url
    os.environ["CARPOOL_KEY_PREFIX"] = prefix = f"instr-{uuid.uuid4().hex[:8]}"
    config = None
    if route != "none":
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(VERSION_TABLE)
        config = Path(f.name)
        os.environ["CARPOOL_CONFIG"] = str(config)
    from carpool.backend.connection import connect
    from web import create_app

    client = create_app().test_client()
    if route == "rollout":
        answer = client.put("/models/synthetic/rollout", json={"version": "2", "percent": 50})
        assert answer.status_code == 200, answer.get_data(as_text=True)
    model = "synthetic@2" if route == "pinned" else "synthetic"
    body = {"model": model, "input": {"value": 1, "size": 8}}
    for _ in range(WARM_SUBMITS + n):  # every one admitted: a 429 would take another path
        assert client.post("/submit", json=body).status_code == 202
    r = connect(redis_url)
    stale = list(r.scan_iter(match="{" + prefix + "}*", count=1000))
    for i in range(0, len(stale), 1000):
        r.delete(*stale[i:i + 1000])
    if config is not None:
        config.unlink()


def instructions(n: int, redis_url: str, route: str) -> int:
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--submits", str(n), "--redis-url", redis_url, "--route", route],
        env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise RuntimeError(f"no callgrind total in: {run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--low", type=int, default=50)
    p.add_argument("--high", type=int, default=450)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--route", choices=ROUTES, default="none",
                   help="what the submits name (see above)")
    p.add_argument("--submits", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.submits is not None:  # the run under callgrind
        submit_many(args.submits, args.redis_url, args.route)
        return 0
    low = instructions(args.low, args.redis_url, args.route)
    high = instructions(args.high, args.redis_url, args.route)
    per_submit = (high - low) / (args.high - args.low)
    print(f"{per_submit:,.0f} instructions per POST /submit, route {args.route} "
          f"({args.low}: {low:,}, {args.high}: {high:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
