"""Rollouts end to end: real gunicorn (two processes), a private Redis with an AOF, one
worker serving ``hemb`` (version 1, 8-wide vectors) and one ``hemb@2`` (16-wide) and
``hemb@3`` (version 1's twin). Under a steady stream of jobs that name no version, a
ramp 0 → 50 → 100 % sends each phase's share to version 2 and a rollback sends every
new job home; a Redis restart in the middle of a ramp loses no acknowledged job. Every
job runs on the version its 202 named (the batch stamps say so) and no batch holds two
versions. A shadow's comparison counters move: all agree for the twin, none for
version 2, whose vectors are another width."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from carpool.core.rollouts import ROLLOUT_REFRESH_S
from tests.conftest import make_env
from tests.support.bulk import CATALOGUE_TOML
from tests.support.faults import record
from tests.support.procs import start_web, start_worker, wait_until
from tests.support.promtext import scrape
from tests.support.redisproc import RedisProc, private_redis

VERSIONS = """
[models.hemb.versions.2.options]
dim = 16
[models.hemb.versions.3]
result_ttl_s = 3600
"""
#: Each version's vector width.
WIDTH = {"1": 8, "2": 16, "3": 8}
#: Jobs of each phase sent once every web process sees its change.
PHASE_JOBS = 60
#: The steady load: one job this often (a paced client, not a wait for work).
SEND_EVERY_S = 0.01
WAIT_S = 60.0
FINAL = ("done", "failed", "expired", "cancelled")


@dataclass
class Sent:
    at: float
    id: str
    version: str


@dataclass
class Load:
    """A client sending one job that names no version every SEND_EVERY_S until stopped;
    what the web answered 202 to, and every other answer, are kept."""

    base: str
    sent: list[Sent] = field(default_factory=list)
    refused: dict[int, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        """Stop sending; returns once the last request is answered and kept."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)

    def run(self) -> None:
        with requests.Session() as s:
            i = 0
            while not self.stop.wait(SEND_EVERY_S):
                i += 1
                try:
                    r = s.post(f"{self.base}/submit", timeout=10, json={
                        "model": "hemb", "input": {"text": f"steady text {i}"}})
                except requests.ConnectionError:
                    self.refused[0] = self.refused.get(0, 0) + 1
                    continue
                if r.status_code == 202:
                    body = r.json()
                    self.sent.append(Sent(time.monotonic(), body["id"], body["model_version"]))
                else:
                    self.refused[r.status_code] = self.refused.get(r.status_code, 0) + 1

    def after(self, at: float) -> list[Sent]:
        return [s for s in self.sent if s.at >= at]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisProc]:
    with private_redis("--appendonly", "yes", "--appendfsync", "everysec") as server:
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisProc) -> Iterator[str]:
    config: Path = tmp_path_factory.mktemp("rollouts") / "catalogue.toml"
    config.write_text(CATALOGUE_TOML + VERSIONS)
    env = make_env(redis_server.url, "rollouts", CARPOOL_CONFIG=str(config),
                   CARPOOL_SYNTHETIC_COST_MS="5,0")
    with (start_web(env) as base,
          start_worker({**env, "CARPOOL_MODELS": "hemb", "CARPOOL_WORKER_NAME": "v1@r"},
                       "v1@r"),
          start_worker({**env, "CARPOOL_MODELS": "hemb@2,hemb@3",
                        "CARPOOL_WORKER_NAME": "v23@r"}, "v23@r")):
        yield base


@pytest.fixture
def load(stack: str) -> Iterator[Load]:
    assert requests.delete(f"{stack}/models/hemb/rollout", timeout=10).status_code == 200
    running = Load(stack)
    running.start()
    try:
        yield running
    finally:
        running.finish()


def change(base: str, body: dict[str, Any] | None) -> float:
    """PUT ``body`` (None: DELETE); when every web process routes by it."""
    url = f"{base}/models/hemb/rollout"
    resp = (requests.delete(url, timeout=10) if body is None
            else requests.put(url, json=body, timeout=10))
    assert resp.status_code == 200, resp.text
    return time.monotonic() + ROLLOUT_REFRESH_S


def phase(load: Load, body: dict[str, Any] | None) -> list[str]:
    """The versions of PHASE_JOBS jobs sent once every process saw the change."""
    settled = change(load.base, body)
    wait_until(lambda: len(load.after(settled)) >= PHASE_JOBS, WAIT_S,
               f"{PHASE_JOBS} jobs sent after {body}")
    return [s.version for s in load.after(settled)[:PHASE_JOBS]]


def documents(base: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Every job's final document, read until all ended."""
    docs: dict[str, dict[str, Any]] = {}

    def read(job_id: str) -> None:
        doc = requests.get(f"{base}/result/{job_id}", timeout=10).json()
        if doc.get("status") in FINAL:
            docs[job_id] = doc

    def all_ended() -> bool:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(read, [i for i in ids if i not in docs]))
        return len(docs) == len(ids)

    wait_until(all_ended, WAIT_S, "every acknowledged job to end")
    return docs


def assert_each_ran_where_admitted(load: Load) -> dict[str, dict[str, Any]]:
    """Every 202'd job ended done, on the version its 202 named; no batch mixes two."""
    docs = documents(load.base, [s.id for s in load.sent])
    batches: dict[str, set[str]] = {}
    for sent in load.sent:
        doc = docs[sent.id]
        assert doc["status"] == "done", doc
        assert doc["model_version"] == doc["batch"]["model_version"] == sent.version, doc
        assert len(doc["result"]["embedding"]) == WIDTH[sent.version]
        batches.setdefault(doc["batch"]["id"], set()).add(sent.version)
    assert all(len(versions) == 1 for versions in batches.values()), batches
    return docs


def test_a_ramp_under_steady_load_then_a_rollback_loses_nothing_and_mixes_no_batch(
        load: Load) -> None:
    assert set(phase(load, {"version": "2", "percent": 0})) == {"1"}
    half = phase(load, {"version": "2", "percent": 50})
    assert 0.25 <= half.count("2") / len(half) <= 0.75, half
    assert set(phase(load, {"version": "2", "percent": 100})) == {"2"}
    assert set(phase(load, None)) == {"1"}  # the rollback: every new job home
    load.finish()
    assert_each_ran_where_admitted(load)
    assert load.refused == {}
    record("rollout ramp 0/50/100 % then rollback, steady load", jobs=len(load.sent),
           half_share=round(half.count("2") / len(half), 2), failed=0, lost=0)


def test_a_redis_restart_during_a_ramp_loses_no_job_and_moves_none(
        load: Load, redis_server: RedisProc) -> None:
    half = phase(load, {"version": "2", "percent": 50})
    assert {"1", "2"} == set(half)
    redis_server.stop()  # SHUTDOWN: the AOF is written whole
    before = len(load.sent)
    redis_server.restart()
    wait_until(lambda: len(load.sent) >= before + PHASE_JOBS, WAIT_S,
               f"{PHASE_JOBS} jobs admitted after the restart")
    after = [s.version for s in load.sent[before:before + PHASE_JOBS]]
    assert 0.25 <= after.count("2") / len(after) <= 0.75, after  # the state survived
    assert set(phase(load, {"version": "2", "percent": 100})) == {"2"}
    load.finish()
    assert_each_ran_where_admitted(load)
    assert set(load.refused) <= {0, 503}, load.refused  # only while Redis was away
    record("Redis restarted during a rollout ramp", jobs=len(load.sent), lost=0,
           refused_while_down=sum(load.refused.values()))


def shadow_counts(base: str, version: str) -> tuple[float, float]:
    found = scrape(f"{base}/metrics")
    return (found.value("carpool_shadow_compared_total", model="hemb", version=version),
            found.value("carpool_shadow_agreed_total", model="hemb", version=version))


def compared_past(base: str, version: str, floor: float) -> bool:
    return shadow_counts(base, version)[0] >= floor


def test_a_shadows_comparison_counters_move_and_its_copies_are_never_answered(
        load: Load) -> None:
    settled = change(load.base, None)  # no rollout: every process sends all to 1
    start = {v: shadow_counts(load.base, v) for v in ("2", "3")}
    for version in ("3", "2"):
        change(load.base, {"shadow": version, "percent": 100})
        wait_until(partial(compared_past, load.base, version, start[version][0] + 20),
                   WAIT_S, f"20 comparisons with shadow {version}")
    # The comparisons may all come before every web process has seen the last change.
    wait_until(lambda: len(load.after(settled)) >= 20, WAIT_S, "20 jobs after the changes")
    assert {s.version for s in load.after(settled)} == {"1"}  # the served version alone
    for_twin, for_v2 = shadow_counts(load.base, "3"), shadow_counts(load.base, "2")
    assert for_twin[1] - start["3"][1] == for_twin[0] - start["3"][0] >= 20  # all agree
    assert for_v2[1] == start["2"][1] and for_v2[0] >= start["2"][0] + 20  # none agree
    load.finish()
    assert_each_ran_where_admitted(load)
