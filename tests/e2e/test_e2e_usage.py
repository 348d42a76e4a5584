"""Usage and quotas through real gunicorn and a real worker: GET /usage agrees with the
sum of the job documents' usage, and a key with a small quota meets 429
``quota_exceeded`` with a Retry-After."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from carpool.backend.usage import key_label
from carpool.core.settings import api_key_digest
from tests.conftest import make_env
from tests.support.procs import start_web, start_worker

ALICE = "alice-key-0123456789abcdef01"
BOB = "bob-key-0123456789abcdef0123"
OPS = "ops-key-0123456789abcdef01234"
SMALL = "small-key-0123456789abcdef01"
JOBS_EACH = 30


@pytest.fixture
def stack(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[str]:
    keys = tmp_path / "keys"
    keys.write_text(f"{ALICE}\n{BOB}\n{OPS} admin\n{SMALL} quota_device_s_per_hour=0.001\n")
    env = make_env(redis_url, key_prefix, CARPOOL_API_KEYS_FILE=str(keys),
                   CARPOOL_SYNTHETIC_COST_MS="3,0.2")
    with start_web(env) as base_url, start_worker({**env, "CARPOOL_MODELS": "synthetic"}):
        yield base_url


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _submit(s: requests.Session, base: str, key: str, i: int) -> requests.Response:
    return s.post(f"{base}/submit", json={"model": "synthetic",
                                          "input": {"value": i, "size": 1 + i % 5}},
                  headers=_as(key), timeout=30)


def test_usage_agrees_with_the_job_documents_and_a_small_quota_meets_429(stack: str) -> None:
    with requests.Session() as s:
        ids: dict[str, list[str]] = {ALICE: [], BOB: []}
        for i in range(JOBS_EACH):
            for key in (ALICE, BOB):
                r = _submit(s, stack, key, i)
                assert r.status_code == 202, r.text
                ids[key].append(r.json()["id"])
        docs: dict[str, list[dict[str, float]]] = {}
        for key, mine in ids.items():
            ended = [s.get(f"{stack}/result/{i}?wait=20", headers=_as(key), timeout=30).json()
                     for i in mine]
            assert [d["status"] for d in ended] == ["done"] * JOBS_EACH
            docs[key] = [d["usage"] for d in ended]
        seen = s.get(f"{stack}/usage?hours=1", headers=_as(OPS), timeout=30).json()
        rows = {r["key"]: r for r in seen["usage"]}
        for key, usage in docs.items():
            row = rows[key_label(api_key_digest(key))]
            device_ms = sum(u["device_ms"] for u in usage)
            assert device_ms > 0
            assert row["jobs"] == JOBS_EACH
            assert row["device_ms"] == pytest.approx(device_ms, rel=0.01)
            assert row["queue_ms"] == pytest.approx(sum(u["queue_ms"] for u in usage), rel=0.01)
        own = s.get(f"{stack}/usage", headers=_as(BOB), timeout=30).json()
        assert [r["key"] for r in own["usage"]] == [key_label(api_key_digest(BOB))]

        # The small key's first job spends its hour's device quota (1 ms) ...
        first = s.post(f"{stack}/submit?wait=20", json={"model": "synthetic",
                                                        "input": {"value": 0, "size": 5}},
                       headers=_as(SMALL), timeout=30)
        assert first.status_code == 200 and first.json()["usage"]["device_ms"] >= 1
        # ... so the next is refused until the hour ends.
        refused = _submit(s, stack, SMALL, 1)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "quota_exceeded"
        assert 1 <= int(refused.headers["Retry-After"]) <= 3600
        small = s.get(f"{stack}/usage", headers=_as(SMALL), timeout=30).json()["usage"]
        assert (small[0]["jobs"], small[0]["refused"]) == (1, 1)


#: A model no worker serves, bounded by depth alone (max_queue_ms = 0).
SHARED_TOML = """
[models.shared]
kind = "synthetic"
measure = "size"
max_queue_ms = 0
[[models.shared.bins]]
name = "only"
max_size = 10
max_batch = 2
max_wait_ms = 5
max_depth = 20
"""
FLEX = "flex-key-0123456789abcdef012"
PRIORITY = "prio-key-0123456789abcdef012"


def test_in_a_surge_the_flex_key_is_refused_first_and_the_priority_key_admitted(
        redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    cfg = tmp_path / "catalogue.toml"
    cfg.write_text(SHARED_TOML)
    keys = tmp_path / "keys"
    keys.write_text(f"{FLEX} tier=flex\n{PRIORITY} tier=priority\n")
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(cfg),
                   CARPOOL_API_KEYS_FILE=str(keys))
    job = {"model": "shared", "input": {"value": 0, "size": 1}}
    with start_web(env) as base, requests.Session() as s:
        flex = [s.post(f"{base}/submit", json=job, headers=_as(FLEX), timeout=30).status_code
                for _ in range(12)]
        assert flex == [202] * 10 + [429] * 2  # half the bin's bound
        # The priority key asking for the flex tier is held to it too ...
        asked = s.post(f"{base}/submit", json={**job, "service_tier": "flex"},
                       headers=_as(PRIORITY), timeout=30)
        assert asked.status_code == 429 and asked.json()["error"]["code"] == "bin_full"
        assert "all this service tier may fill" in asked.json()["error"]["message"]
        # ... and in its own tier it fills the rest.
        prio = [s.post(f"{base}/submit", json=job, headers=_as(PRIORITY), timeout=30).status_code
                for _ in range(10)]
        assert prio == [202] * 10
