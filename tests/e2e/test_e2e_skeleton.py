"""End to end: real gunicorn + a real Celery worker + Redis, synthetic model."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from carpool.core.synthetic import expected_result
from tests.conftest import TINY_TOML, make_env
from tests.support.procs import start_web, start_worker

#: Sizes that land in the synthetic model's three bins.
SIZES = (10, 100, 500)
JOBS, CLIENTS = 2000, 32


@pytest.fixture
def stack(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[str]:
    cfg = tmp_path / "catalogue.toml"
    cfg.write_text(TINY_TOML)
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(cfg),
                   CARPOOL_SYNTHETIC_COST_MS="5,0.2")
    with start_web(env) as base_url, start_worker({**env, "CARPOOL_MODELS": "synthetic"}):
        yield base_url


def submit(s: requests.Session, base: str, job_input: Any, model: str = "synthetic") -> Any:
    return s.post(f"{base}/submit", json={"model": model, "input": job_input}, timeout=30)


def test_2000_jobs_from_32_clients_across_3_bins_all_finish_with_their_own_output(
        stack: str) -> None:
    counter = itertools.count()
    results: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    errors: list[str] = []

    def client() -> None:
        with requests.Session() as s:
            while (i := next(counter)) < JOBS:
                job_input = {"value": {"job": i, "nonce": f"n{i}"}, "size": SIZES[i % 3]}
                r = submit(s, stack, job_input)
                if r.status_code != 202:
                    errors.append(f"submit {i}: {r.status_code} {r.text}")
                    continue
                view = s.get(f"{stack}/result/{r.json()['id']}?wait=30", timeout=60).json()
                results[i] = (job_input, view)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == JOBS
    wrong = [i for i, (inp, view) in results.items()
             if view["status"] != "done" or view["result"] != expected_result(inp)]
    assert wrong == []
    bins = {view["batch"]["bin"] for _, view in results.values()}
    assert bins == {"small", "medium", "large"}
    sizes = [view["batch"]["size"] for _, view in results.values()]
    assert sum(sizes) / len(sizes) > 1


def test_a_lone_job_leaves_by_its_max_wait_while_the_worker_is_idle(stack: str) -> None:
    with requests.Session() as s:
        models = s.get(f"{stack}/models", timeout=10).json()
        max_wait_ms = next(b["max_wait_ms"] for m in models["models"]
                           if m["name"] == "synthetic" for b in m["bins"] if b["name"] == "small")
        for i in range(5):
            job_id = submit(s, stack, {"value": i, "size": 1}).json()["id"]
            view = s.get(f"{stack}/result/{job_id}?wait=10", timeout=20).json()
            assert view["status"] == "done"
            assert view["batch"]["size"] == 1
            # The bound is the oldest job's deadline plus one loop turn and a Redis
            # round trip, with generous slack for a 2-core machine under test load.
            assert view["timings_ms"]["queue"] <= max_wait_ms + 250, view


def test_a_full_bin_answers_429_with_retry_after(stack: str) -> None:
    with requests.Session() as s:
        codes = [submit(s, stack, {"value": i, "size": 1}, model="tiny").status_code
                 for i in range(3)]
        assert codes == [202, 202, 202]
        r = submit(s, stack, {"value": 9, "size": 1}, model="tiny")
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "bin_full"  # its depth bound, not another refusal


def test_unknown_id_is_404_and_invalid_input_is_400(stack: str) -> None:
    with requests.Session() as s:
        assert s.get(f"{stack}/result/{'A' * 26}", timeout=10).status_code == 404
        r = submit(s, stack, {"value": 1, "size": "big"})
        assert r.status_code == 400
        assert "size" in json.dumps(r.json())
