"""CPU per ``POST /submit`` by stage, in-process: where a submit's web CPU goes, without
gunicorn, gevent or a profiler's distortion.

    python ops/bench/web_stages.py --submits 6000

Builds the app of this checkout (real Redis at --redis-url, a fresh key prefix), warms
it, then calls its WSGI app directly with a prepared environ: no test client, no
sockets of gunicorn's. Submits go in chunks of CHUNK, the key prefix emptied between
chunks (untimed), so admission never refuses for a full bin. Each stage of STAGES is
timed inclusively with ``time.process_time`` (this process's CPU: a Redis round trip
counts its syscalls, not its wait), so a stage's figure holds its children's; each
timer adds about a microsecond to every stage around it. ``web_cpu.py`` measures the
whole web under gunicorn, ``web_floor.py`` gunicorn's own part.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import json
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import redis

#: Submits per timed chunk; the keys go between chunks, far below any bin's bound.
CHUNK = 200
WARM_SUBMITS = 300
BODY = json.dumps({"model": "synthetic", "input": {"value": 1, "size": 8}}).encode()
#: (module, attribute path) of each stage timed, outermost first. Each is looked up by
#: its callers at call time (a method, or a module global), so replacing it here counts.
STAGES = (
    ("web.common.shedding", "Shedder.__call__"),
    ("web.common.lean", "LeanRoutes.__call__"),
    ("web.common.lean", "LeanRoutes._answer"),
    ("web.common.lean", "read_post_body"),
    ("web.jobs.routes", "_request_wait"),
    ("web.jobs.routes", "_read_submission"),
    ("carpool.intake.inputs", "submission_from_json"),
    ("carpool.intake.inputs", "prepare"),
    ("web.common.sync_wait", "SyncWait.admit_one"),
    ("carpool.backend.admissions", "Admissions.admit"),
    ("carpool.backend.lean_script", "LeanScript.__call__"),
    ("web.common.sync_wait", "SyncWait.finals"),
    ("web.jobs.routes", "_accepted"),
    ("web.common.lean", "Answer.body_and_headers"),
)


def timed(spent_s: defaultdict[str, float], calls: Counter[str]) -> None:
    """Replace each stage with a wrapper that adds its CPU to ``spent_s``."""
    for module_name, path in STAGES:
        owner: Any = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        inner: Callable[..., Any] = getattr(owner, name)

        def wrapper(*args: Any, _inner: Callable[..., Any] = inner, _path: str = path,
                    **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent_s[_path] += time.process_time() - started
                calls[_path] += 1

        setattr(owner, name, functools.wraps(inner)(wrapper))


def environ() -> dict[str, Any]:
    """A keep-alive client's ``POST /submit`` as gunicorn hands it over."""
    return {"REQUEST_METHOD": "POST", "PATH_INFO": "/submit", "QUERY_STRING": "",
            "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(BODY)),
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "127.0.0.1:8000", "wsgi.input": io.BytesIO(BODY),
            "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
            "wsgi.input_terminated": True, "wsgi.version": (1, 0),
            "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--submits", type=int, default=6000)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()
    prefix = f"stages-{uuid.uuid4().hex[:8]}"
    os.environ["CARPOOL_REDIS_URL"] = args.redis_url
    os.environ["CARPOOL_KEY_PREFIX"] = prefix
    from carpool.backend.keys import Keys
    from web import create_app

    app = create_app()
    client = redis.Redis.from_url(args.redis_url)
    patterns = Keys(prefix).patterns

    def clean() -> None:
        for pattern in patterns:
            stale = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(stale), 1000):
                client.delete(*stale[i:i + 1000])

    statuses: Counter[str] = Counter()

    def start_response(status: str, _headers: list[tuple[str, str]], _exc: Any = None,
                       ) -> Callable[[bytes], object]:
        statuses[status] += 1
        return lambda _data: None

    def submit() -> None:
        b"".join(app(environ(), start_response))

    for _ in range(WARM_SUBMITS):
        submit()
    spent_s: defaultdict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    timed(spent_s, calls)
    statuses.clear()
    total_s = 0.0
    chunks = max(1, args.submits // CHUNK)
    try:
        for _ in range(chunks):
            clean()
            started = time.process_time()
            for _ in range(CHUNK):
                submit()
            total_s += time.process_time() - started
    finally:
        clean()
    n = chunks * CHUNK
    print(f"{n} submits in-process, {time.strftime('%Y-%m-%d')}; answers: {dict(statuses)}")
    print(f"| stage | µs of CPU per submit | of the total | calls per submit |\n|---|---|---|---|"
          f"\n| all | {total_s / n * 1e6:.1f} | 1.00 | 1 |")
    for _, path in STAGES:
        print(f"| `{path}` | {spent_s[path] / n * 1e6:.1f} | {spent_s[path] / total_s:.2f} "
              f"| {calls[path] / n:.2f} |")
    return 0 if set(statuses) == {"202 ACCEPTED"} else 1


if __name__ == "__main__":
    raise SystemExit(main())
