"""Hostile load on memory: one model's flood cannot fill Redis for the others.

Real gunicorn and a private redis-server whose maxmemory sits a little above what
the byte budgets allow; no worker, so nothing drains (as with a model nobody serves).
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import make_env
from tests.support.procs import REPO_ROOT, start_web, web_command
from tests.support.redisproc import RedisProc, private_redis

#: The flood's largest allowed input: 64 KiB as JSON, less the envelope.
BIG_VALUE_CHARS = (64 << 10) - 64
#: Budget of the flooded model; Redis gets this much room and a margin above it.
BIG_BUDGET_BYTES = 4 << 20
#: Free memory the private Redis has above what it holds at start: the budget fits,
#: the bins' max_depth (5000 x 64 KiB = 320 MB) would not.
REDIS_ROOM_BYTES = 24 << 20
#: Submits of the flood: 400 x 64 KiB = 25 MiB, past the room without a budget.
FLOOD = 400
OTHER_SUBMITS = 20

HOSTILE_TOML = f"""
[models.big]
kind = "synthetic"
measure = "size"
max_input_bytes = 65536
max_queued_bytes = {BIG_BUDGET_BYTES}
[[models.big.bins]]
name = "only"
max_size = 10
max_batch = 8
max_wait_ms = 20
max_depth = 5000

[models.other]
kind = "synthetic"
measure = "size"
[[models.other.bins]]
name = "only"
max_size = 10
max_batch = 8
max_wait_ms = 20
max_depth = 5000
"""


@pytest.fixture
def server() -> Iterator[RedisProc]:
    with private_redis("--maxmemory-policy", "noeviction") as server:
        with server.client() as c:
            c.config_set("maxmemory", int(c.info("memory")["used_memory"]) + REDIS_ROOM_BYTES)
        yield server


def test_a_flood_of_one_models_largest_inputs_leaves_other_models_submits_working(
        server: RedisProc, tmp_path: Path, key_prefix: str) -> None:
    config = tmp_path / "catalogue.toml"
    config.write_text(HOSTILE_TOML)
    env = make_env(server.url, key_prefix, CARPOOL_CONFIG=str(config))
    big = {"model": "big", "input": {"value": "x" * BIG_VALUE_CHARS, "size": 1}}
    codes: Counter[int | str] = Counter()
    with start_web(env) as base, requests.Session() as s:
        for _ in range(FLOOD):
            r = s.post(f"{base}/submit", json=big, timeout=30)
            codes[r.status_code] += 1
            if r.status_code != 202:
                codes[r.json()["error"]["code"]] += 1
        others = [s.post(f"{base}/submit", json={"model": "other",
                                                  "input": {"value": i, "size": 1}},
                         timeout=30).status_code for i in range(OTHER_SUBMITS)]
    admitted = codes[202]
    assert 0 < admitted <= BIG_BUDGET_BYTES // BIG_VALUE_CHARS, codes
    assert codes[429] == codes["budget_full"] == FLOOD - admitted, codes
    assert others == [202] * OTHER_SUBMITS


def test_web_refuses_to_start_when_the_budgets_do_not_fit_maxmemory_and_says_why(
        tmp_path: Path, key_prefix: str) -> None:
    """The shipped catalogue (about 760 MiB of budgets) against a 64 MB Redis."""
    with private_redis("--appendonly", "yes", "--maxmemory", "64mb",
                       "--maxmemory-policy", "noeviction") as server:
        env = {**make_env(server.url, key_prefix, CARPOOL_REQUIRE_DURABLE="1"),
               "CARPOOL_WEB_BIND": "127.0.0.1:0", "CARPOOL_WEB_WORKERS": "1"}
        out = subprocess.run(web_command(), env={**os.environ, **env}, cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "queued jobs may take" in out.stderr and "of maxmemory 64 MiB" in out.stderr, \
        out.stderr[-3000:]


def test_with_api_keys_one_key_cannot_spend_a_whole_models_budget(
        server: RedisProc, tmp_path: Path, key_prefix: str) -> None:
    """Per key: half of max_queued_bytes by default; a second key still gets its half."""
    config = tmp_path / "catalogue.toml"
    config.write_text(HOSTILE_TOML)
    keys = ["a" * 32, "b" * 32]
    env = make_env(server.url, key_prefix, CARPOOL_CONFIG=str(config),
                   CARPOOL_API_KEYS=",".join(keys))
    big = {"model": "big", "input": {"value": "x" * BIG_VALUE_CHARS, "size": 1}}
    admitted: dict[str, int] = {}
    with start_web(env) as base, requests.Session() as s:
        for key in keys:
            codes: Counter[int] = Counter()
            for _ in range(2 * BIG_BUDGET_BYTES // BIG_VALUE_CHARS):
                r = s.post(f"{base}/submit", json=big, timeout=30,
                           headers={"Authorization": f"Bearer {key}"})
                codes[r.status_code] += 1
            admitted[key] = codes[202]
            assert codes[429] > 0, codes
    per_key = (BIG_BUDGET_BYTES // 2) // BIG_VALUE_CHARS
    assert admitted == {keys[0]: per_key, keys[1]: per_key}
