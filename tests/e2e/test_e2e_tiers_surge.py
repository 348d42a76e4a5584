"""Service tiers in a surge, end to end: ops/bench/tiers.py in miniature against real
gunicorn and a real worker. A priority key at ½ and a flex key at 1½ × the model's
served rate, every caller waiting 10 s: the priority key's jobs end in time, the flex
key takes the refusals, and GET /usage agrees with the job documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT

#: A slow model (a full batch of 32 in 0.8 s) keeps the web far from its limit on a
#: loaded 2-core machine: 80 jobs/s offered at about 1.5 ms of web CPU each. 12 s of
#: surge: without tiers the queue reaches the priority key's 9 s within it.
MODEL_RATE, SURGE_S = 40, 12
#: The priority key's misses allowed: 1 %, but at least 3 of its ~240 jobs. Its jobs
#: wait behind the flex key's half of the wait (about 4.5 s), and one batch run slow on
#: a busy machine can push a job or two past the caller's 10 s; without tiers it misses
#: ~10 % here.
MISS_SHARE, MISS_SLACK = 0.01, 3


def test_in_a_surge_priority_jobs_end_in_time_and_flex_takes_the_refusals(
        redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "tiers.json"
    subprocess.run(
        [sys.executable, "ops/bench/tiers.py", "--duration", str(SURGE_S),
         "--model-rate", str(MODEL_RATE), "--drain-s", "3", "--redis-url", redis_url,
         "--out", str(out)],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=240, check=True)
    result = json.loads(out.read_text())
    prio, flex = result["keys"]["priority"], result["keys"]["flex"]
    assert prio["offered"] > 0.5 * MODEL_RATE * SURGE_S / 2  # the load was offered

    missed = prio["offered"] - prio["done"]
    assert missed <= max(MISS_SLACK, MISS_SHARE * prio["offered"]), prio
    refused_flex = sum(flex["refused"].values())
    refused_prio = sum(prio["refused"].values())
    assert refused_flex > 0, flex
    assert refused_flex >= 0.95 * (refused_flex + refused_prio), (prio, flex)

    for tier in ("priority", "flex"):
        seen, docs = result["usage"][tier]["usage"], result["usage"][tier]["docs"]
        assert seen["jobs"] == docs["jobs"] > 0
        assert seen["device_ms"] == pytest.approx(docs["device_ms"], rel=0.01)
        assert seen["queue_ms"] == pytest.approx(docs["queue_ms"], rel=0.01)
        assert seen["refused"] == result["keys"][tier]["refused_429"]
