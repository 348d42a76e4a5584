"""carpool on a real Redis Cluster (3 masters on loopback, CARPOOL_REDIS_CLUSTER=1):
each model's keys in one slot, models spread over the masters; the end-to-end path
with four models, a worker blocking on several shards, and a killed worker."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys, shard
from carpool.backend.queue import Queue
from carpool.backend.rollouts import RolloutStore
from carpool.backend.shadows import ShadowBook
from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import JobStatus, Outcome, new_job_id
from carpool.core.rollouts import change
from carpool.core.synthetic import expected_result
from tests.conftest import make_env
from tests.e2e.test_faults_worker import held_by
from tests.support.faults import DoneCounter, admit_jobs, all_final, assert_one_place
from tests.support.procs import WORKER_START_TIMEOUT_S, start_web, start_worker, wait_until
from tests.support.redisproc import RedisProc, close_cluster_client, private_cluster, private_redis
from web.results.waiters import Notifier

#: Four models; their shard tags hash to four different slots (checked below).
MODELS = ("alpha", "bravo", "charlie", "delta")
CATALOGUE = "".join(f"""
[models.{m}]
kind = "synthetic"
measure = "size"
[[models.{m}.bins]]
name = "only"
max_size = 64
max_batch = 8
max_wait_ms = 5
max_depth = 1000
""" for m in MODELS)
LEASE_MS = 1500
#: A batch that takes this long is surely still running when the kill lands.
SLOW = "3000,0"
FAST = "5,0.5"


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisProc]]:
    with private_cluster() as nodes:
        yield nodes


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisProc]:
    """Celery's own Redis: kombu does not speak Cluster (jobs never pass through it)."""
    with private_redis() as server:
        yield server


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "catalogue.toml"
    path.write_text(CATALOGUE)
    return path


@pytest.fixture
def cq(cluster: list[RedisProc], key_prefix: str) -> Iterator[Queue]:
    client = connect(cluster[0].url, cluster=True)
    queue = Queue(client, Keys(key_prefix))
    yield queue
    if queue._waiters is not None:
        queue._waiters.close()
    close_cluster_client(client)


def env_for(cluster: list[RedisProc], broker: RedisProc, prefix: str, config: Path,
            cost: str = FAST) -> dict[str, str]:
    # Any node will do: the client learns the others from it.
    return make_env(cluster[1].url, prefix, CARPOOL_REDIS_CLUSTER="1",
                    CELERY_BROKER_URL=broker.url, CARPOOL_CONFIG=str(config),
                    CARPOOL_MODELS=",".join(MODELS), CARPOOL_LEASE_MS=str(LEASE_MS),
                    CARPOOL_SYNTHETIC_COST_MS=cost)


def master_port(cq: Queue, key: str) -> int:
    """The port of the master that owns ``key``'s slot."""
    return int(cq.client.get_node_from_key(key).port)  # type: ignore[attr-defined]


def test_each_models_keys_share_one_slot_and_the_models_spread_over_masters(
        cq: Queue) -> None:
    keys = cq.keys
    slots = {}
    for m in MODELS:
        tag = shard(m)
        model_keys = [keys.bin(m, "only"), keys.job(new_job_id(m)), keys.wake(m),
                      keys.stats(m, "only"), keys.idempotency(m, "k"), keys.leases(tag),
                      keys.dead(tag)]
        model_slots = {cq.client.cluster_keyslot(k) for k in model_keys}
        assert len(model_slots) == 1, (m, model_keys)  # one script may touch them all
        slots[m] = model_slots.pop()
    assert len(set(slots.values())) == len(MODELS)
    masters = {master_port(cq, keys.bin(m, "only")) for m in MODELS}
    assert len(masters) >= 2  # the four models do not all load one master


def test_four_models_every_job_done_with_its_own_result_on_a_cluster(
        cluster: list[RedisProc], broker: RedisProc, key_prefix: str, config: Path) -> None:
    env = env_for(cluster, broker, key_prefix, config)
    inputs = {m: [{"value": f"{m}-{i}", "size": 1 + i % 8} for i in range(12)] for m in MODELS}
    with start_web(env) as base, start_worker(env, "w1@cluster"), requests.Session() as http:
        ids: dict[str, list[str]] = {}
        for m in MODELS:
            resp = http.post(f"{base}/submit/batch", json={"model": m, "inputs": inputs[m]},
                             timeout=30)
            assert resp.status_code == 202, resp.text
            ids[m] = [job["id"] for job in resp.json()["jobs"]]
            assert len(ids[m]) == len(inputs[m])
        for m in MODELS:
            for job_id, job_input in zip(ids[m], inputs[m], strict=True):
                body: dict[str, Any] = http.get(f"{base}/result/{job_id}?wait=60",
                                                timeout=90).json()
                assert body["status"] == "done", body
                assert body["model"] == m
                assert body["result"] == expected_result(job_input)
        # Reads that span shards (one pipelined call per node): the catalogue's depths.
        models = http.get(f"{base}/models", timeout=30).json()["models"]
        depths = {m["name"]: m["bins"][0]["depth"] for m in models}
        assert {m: depths[m] for m in MODELS} == dict.fromkeys(MODELS, 0)


def test_a_worker_blocked_on_several_shards_wakes_for_a_job_on_any_of_them(
        cq: Queue, cluster: list[RedisProc]) -> None:
    assert cq.wait_for_work(MODELS, 0.2) is False  # nothing arrived: times out
    woke: list[bool] = []
    waiting = threading.Thread(target=lambda: woke.append(cq.wait_for_work(MODELS, 60)))
    waiting.start()
    last = MODELS[-1]
    node = next(n for n in cluster if n.port == master_port(cq, cq.keys.wake(last)))

    def blocked_there() -> bool:
        with node.client() as c:
            return any(cl.get("cmd") == "blpop" for cl in c.client_list())
    wait_until(blocked_there, 30, f"a BLPOP on the shard of {last}")
    cq.client.rpush(cq.keys.wake(last), "only")
    waiting.join(60)
    assert woke == [True]


def test_killed_worker_jobs_complete_exactly_once_on_a_cluster(
        cluster: list[RedisProc], broker: RedisProc, cq: Queue, key_prefix: str,
        config: Path) -> None:
    spec = load_catalogue(config).get("bravo")
    values: list[object] = list(range(12))
    ids = admit_jobs(cq, spec, values)
    done = DoneCounter(cq.client, cq.keys.done_channel)
    try:
        with start_worker(env_for(cluster, broker, key_prefix, config, SLOW),
                          "w1@cluster") as w1:
            wait_until(lambda: held_by(cq, ids, "w1@cluster"), 30, "w1 to hold a batch")
            w1.send_signal(signal.SIGKILL)
            w1.wait(10)
        assert_one_place(cq.client, cq.keys, ids, MODELS)
        with start_worker(env_for(cluster, broker, key_prefix, config), "w2@cluster"):
            wait_until(lambda: all_final(cq, ids), LEASE_MS / 1000 + WORKER_START_TIMEOUT_S + 10,
                       "every job of the killed worker to complete")
        counts = done.counted(ids)
    finally:
        done.close()
    assert counts == {job_id: 1 for job_id in ids}  # each result written exactly once
    for job_id, value in zip(ids, values, strict=True):
        view = cq.get(job_id)
        assert view is not None and view.status is JobStatus.DONE
        assert view.result == expected_result({"value": value, "size": 1})
    assert_one_place(cq.client, cq.keys, ids, MODELS)


def test_a_web_process_learns_admissions_and_ends_on_every_shard(
        cq: Queue, config: Path) -> None:
    """The long-poll listener hears admit.lua's and complete.lua's notices from every
    master, a job's admission before its end (both published by its shard's master)."""
    notifier = Notifier(cq.client, cq.keys.done_channel, cq.keys.admitted_channel,
                        cq.keys.results_channel)
    try:
        # The listener subscribes on every master (a poll registered before that is
        # woken by it; one registered after hears notices from then on).
        wait_until(notifier.listening, 30, "the listener to subscribe on every master")
        catalogue = load_catalogue(config)
        ids = {m: admit_jobs(cq, catalogue.get(m), [m])[0] for m in MODELS}
        wait_until(lambda: notifier.pending() == len(MODELS), 30, "every admission notice")
        with ExitStack() as stack:
            watched = {m: stack.enter_context(notifier.watch_pending(ids[m])) for m in MODELS}
            assert all(pending for _, pending in watched.values())
            for m in MODELS:
                spec = catalogue.get(m)
                claim = cq.claim(spec, "only", 10, lease_ms=30_000, token=f"t-{m}", worker="w")
                cq.complete(spec, claim, [Outcome(j.id, result={"ok": 1}) for j in claim.jobs],
                            {"size": len(claim.jobs), "bin": "only", "worker": "w"})
            assert all(woken.wait(30) for woken, _ in watched.values())
        wait_until(lambda: notifier.pending() == 0, 30, "every end notice")
    finally:
        notifier.close()


def test_a_rollouts_state_drain_counts_and_shadow_pairs_work_on_a_cluster(
        cq: Queue, key_prefix: str) -> None:
    """Each model's rollout keys are in its own slot; the reads that span models are
    pipelines, the change a WATCH/MULTI on one key, the drain count one script."""
    spec = load_catalogue(None).get("synthetic")
    store, book = RolloutStore(cq.client, cq.keys), ShadowBook(cq, cq.keys)
    store.update("synthetic", lambda now, ms: change(now, {"retire": "1"}, ["1"], "0", ms))
    state = store.read(["synthetic", "minilm"])
    assert list(state["synthetic"].retiring) == ["1"] and state["minilm"].is_empty()
    (job,) = admit_jobs(cq, spec, [1])
    assert store.pinned(spec) == (1, 0)
    claim = cq.claim(spec, "small", 8, lease_ms=60_000, token="t", worker="w")
    assert store.pinned(spec) == (0, 1)
    cq.complete(spec, claim, [Outcome(job, result=expected_result({"value": 1, "size": 1}))],
                {"size": 1})
    assert store.holding_key(["synthetic", "minilm"], "0" * 64) is None
    book.add("synthetic", [(job, job)], 0)
    assert book.compare({"synthetic": "synthetic", "minilm": "text"}) == 1
    assert book.counts(["synthetic"]) == {"synthetic": {"1": (1, 1)}}
