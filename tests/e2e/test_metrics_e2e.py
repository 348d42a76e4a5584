"""End to end: the metrics of real gunicorn (2 processes) and a real Celery worker move
under load, and agree with the jobs sent and the results they came back with."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import TINY_TOML, make_env
from tests.support.deployfiles import load_metrics
from tests.support.procs import REPO_ROOT, free_port, start_web, start_worker, wait_until
from tests.support.promtext import scrape

#: Sizes in the synthetic model's small and medium bins.
SIZES = (10, 100)
JOBS, CLIENTS = 200, 8
#: Jobs sent to the large bin with a 1 ms deadline before the worker starts, so it
#: passes before any claim (a worker that is up claims a job whose deadline is near
#: at once, and may take it within the millisecond: docs/scheduling.md).
LATE_JOBS = 4
#: Exported by a worker only when CUDA is in use.
GPU_ONLY = {"carpool_gpu_memory_used_bytes", "carpool_gpu_memory_reserved_bytes",
            "carpool_gpu_memory_free_bytes"}
#: Exported by the webhook dispatcher, not by the web or a worker
#: (tests/e2e/test_e2e_webhooks.py scrapes them).
DISPATCHER_ONLY = {"carpool_webhook_deliveries_total", "carpool_webhook_delivery_latency_seconds"}
#: Served by the feeder (tests/e2e/test_e2e_bulk_metrics.py scrapes them there).
FEEDER_ONLY = {"carpool_feeder_lines_admitted_total", "carpool_feeder_lines_stored_total",
               "carpool_feeder_batches_ended_total", "carpool_feeder_batches_running",
               "carpool_feeder_step_seconds"}
#: Exported once a shadow copy was compared (tests/e2e/test_e2e_rollouts.py scrapes them).
SHADOW_ONLY = {"carpool_shadow_compared_total", "carpool_shadow_agreed_total"}
#: Bound on the worker's counters catching up with results already delivered.
CATCH_UP_S = 20.0


@dataclass(frozen=True)
class Stack:
    web: str
    worker_metrics: str
    metrics_dir: Path
    late: list[str]  # ids of the LATE_JOBS


@pytest.fixture
def stack(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[Stack]:
    cfg = tmp_path / "catalogue.toml"
    cfg.write_text(TINY_TOML)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"an earlier run's file")
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(cfg),
                   CARPOOL_SYNTHETIC_COST_MS="5,0.2")
    port = free_port()
    worker_env = {**env, "CARPOOL_MODELS": "synthetic", "CARPOOL_WORKER_METRICS_PORT": str(port)}
    web_env = {**env, "CARPOOL_WEB_WORKERS": "2", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    with start_web(web_env) as base_url:
        late = submit_late(base_url)
        with start_worker(worker_env):
            yield Stack(base_url, f"http://127.0.0.1:{port}/metrics", metrics_dir, late)


def submit_late(base: str) -> list[str]:
    with requests.Session() as s:
        return [s.post(f"{base}/submit", json={"model": "synthetic", "deadline_ms": 1,
                                               "input": {"value": i, "size": 500}},
                       timeout=10).json()["id"] for i in range(LATE_JOBS)]


def run_load(base: str) -> list[dict[str, Any]]:
    """JOBS jobs from CLIENTS clients, each submitted and awaited; their final views."""
    counter = itertools.count()
    views: list[dict[str, Any]] = []
    errors: list[str] = []

    def client() -> None:
        with requests.Session() as s:
            while (i := next(counter)) < JOBS:
                job_input = {"value": i, "size": SIZES[i % len(SIZES)]}
                r = s.post(f"{base}/submit", json={"model": "synthetic", "input": job_input},
                           timeout=30)
                if r.status_code != 202:
                    errors.append(r.text)
                    continue
                views.append(s.get(f"{base}/result/{r.json()['id']}?wait=30", timeout=60).json())

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return views


def send_late_and_refused(s: requests.Session, base: str, late: list[str],
                          ) -> tuple[int, Counter[str]]:
    """The late jobs' ends, and submits refused for each reason; how many of each."""
    statuses = [s.get(f"{base}/result/{job_id}?wait=20", timeout=30).json()["status"]
                for job_id in late]
    codes: Counter[str] = Counter()
    for body in ({"model": "synthetic", "input": {"size": "x"}}, {"model": "nope", "input": {}}):
        codes[s.post(f"{base}/submit", json=body, timeout=10).json()["error"]["code"]] += 1
    for i in range(4):  # no worker serves "tiny": its bin (depth 3) stays full
        r = s.post(f"{base}/submit", json={"model": "tiny", "input": {"value": i, "size": 1}},
                   timeout=10)
        codes[str(r.status_code)] += 1
    assert codes == {"invalid_input": 1, "unknown_model": 1, "202": 3, "429": 1}
    return statuses.count("expired"), codes


def test_metrics_agree_with_the_jobs_sent_and_their_results(stack: Stack) -> None:
    with requests.Session() as s:
        expired, _ = send_late_and_refused(s, stack.web, stack.late)
    views = run_load(stack.web)
    assert len(views) == JOBS and {v["status"] for v in views} == {"done"}
    sizes_seen = Counter((v["batch"]["bin"], v["batch"]["size"]) for v in views)

    for _ in range(4):  # whichever gunicorn process answers, it reports the sum of both
        web = scrape(f"{stack.web}/metrics")
        assert web.value("carpool_jobs_submitted_total", model="synthetic") == JOBS + LATE_JOBS
        assert web.value("carpool_jobs_submitted_total", model="tiny", bin="only") == 3
        assert web.value("carpool_jobs_rejected_total", model="tiny", reason="bin_full") == 1
        assert web.value("carpool_jobs_rejected_total", model="synthetic", reason="invalid") == 1
        assert web.value("carpool_jobs_rejected_total", model="", reason="unknown_model") == 1
        assert web.value("carpool_bin_depth", model="tiny", bin="only") == 3
        assert web.value("carpool_bin_depth", model="synthetic") == 0
        # No worker serves tiny, 3 jobs wait: one worker needed, and all of them late
        # (queued past max_queue_ms, or due before a default cold start of 60 s).
        assert web.value("carpool_workers_needed", model="tiny") == 1
        assert web.value("carpool_deadline_misses_projected", model="tiny") == 3
    assert not (stack.metrics_dir / "counter_999999.db").exists()
    assert len(list(stack.metrics_dir.glob("counter_*.db"))) == 2  # one per gunicorn worker

    def caught_up() -> bool:
        return scrape(stack.worker_metrics).value("carpool_jobs_completed_total") == JOBS

    wait_until(caught_up, CATCH_UP_S, "the worker's counters to count every result")
    w = scrape(stack.worker_metrics)
    assert w.value("carpool_jobs_expired_total", model="synthetic", bin="large") == expired
    assert expired == LATE_JOBS
    assert w.value("carpool_jobs_failed_total") == 0
    assert 0 < w.value("carpool_worker_cold_start_seconds", model="synthetic") < 120
    assert w.value("carpool_items_inferred_total") == JOBS
    for name in ("queue_wait", "preprocess", "inference", "job_latency"):
        assert w.value(f"carpool_{name}_seconds_count") == JOBS, name
    assert w.value("carpool_job_latency_seconds_sum") >= w.value("carpool_queue_wait_seconds_sum")
    for bin_name in ("small", "medium"):
        labels = {"model": "synthetic", "bin": bin_name}
        # A batch of n shows n times in the results: the batches are Σ count/n per size.
        batches = sum(count / size for (b, size), count in sizes_seen.items() if b == bin_name)
        assert w.value("carpool_batch_executions_total", **labels) == round(batches)
        assert w.value("carpool_batch_size_count", **labels) == round(batches)
        assert w.value("carpool_batch_size_sum", **labels) == JOBS // len(SIZES)
        assert 0 <= w.value("carpool_padding_waste_ratio", **labels) < 1
        assert w.value("carpool_batch_limit", **labels) == 32

    emitted = {**web.families, **w.families}
    listed = load_metrics()
    assert set(emitted) == set(listed) - GPU_ONLY - DISPATCHER_ONLY - FEEDER_ONLY - SHADOW_ONLY
    for name, family in emitted.items():
        assert (family.type, family.labels) == (listed[name].type, set(listed[name].labels))


def test_gunicorn_gives_metrics_a_fresh_directory_when_none_is_set(
        redis_url: str, key_prefix: str) -> None:
    probe = ("import os, web.gunicorn_conf as c; "
             "assert 'PROMETHEUS_MULTIPROC_DIR' not in os.environ; c.on_starting(None); "
             "print(os.environ['PROMETHEUS_MULTIPROC_DIR'], len(c._made_dirs))")
    env = make_env(redis_url, key_prefix)
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, check=True, text=True,
                         capture_output=True, env={"PATH": "/usr/bin:/bin", **env}).stdout
    path, made = out.split()
    assert made == "1" and Path(path).is_dir() and not any(Path(path).iterdir())
    Path(path).rmdir()
