"""Workers that die, freeze, crash on an input or are stopped: nothing is lost, each
result is written once. Real Celery workers on a private redis-server.

Timing here is a short lease (LEASE_MS) so recovery takes seconds; a slow batch
cost (CARPOOL_SYNTHETIC_COST_MS) makes sure a signal lands while a batch runs.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.connection import connect
from carpool.backend.keys import Keys, shard, shard_of_job
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.jobs import JobStatus, new_job_id
from carpool.core.synthetic import expected_result
from tests.conftest import make_env
from tests.support.faults import (
    DoneCounter,
    Stopwatch,
    admit_jobs,
    all_final,
    assert_one_place,
    attempts_of,
    record,
    spawn_worker,
    statuses,
    stop_process,
)
from tests.support.procs import WORKER_START_TIMEOUT_S, log_says, start_worker, wait_until
from tests.support.redisproc import RedisProc, private_redis
from worker.handlers.synthetic import DEVICE_ASSERT_VALUE, POISON_EXIT_STATUS, POISON_VALUE
from worker.loop.loop import EXIT_DEVICE_LOST

LEASE_MS = 1500
TICK_S = LEASE_MS / 3 / 1000
#: A batch that takes this long is surely still running when the signal lands.
SLOW = "3000,0"
FAST = "20,1"
#: What the stated recovery bound adds to lease + tick: a worker start, and the
#: recovered jobs run one at a time (suspects), a few ms each.
RECOVERY_SLACK_S = WORKER_START_TIMEOUT_S + 10


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProc]:
    with private_redis() as s:
        yield s


@pytest.fixture
def fq(server: RedisProc, key_prefix: str) -> Iterator[Queue]:
    client = connect(server.url)
    yield Queue(client, Keys(key_prefix))
    client.close()


@pytest.fixture
def spec() -> ModelSpec:
    return load_catalogue(None).get("synthetic")


def env_for(server: RedisProc, prefix: str, cost: str, **extra: str) -> dict[str, str]:
    return make_env(server.url, prefix, CARPOOL_LEASE_MS=str(LEASE_MS),
                    CARPOOL_SYNTHETIC_COST_MS=cost, CARPOOL_MODELS="synthetic", **extra)


def held_by(q: Queue, ids: list[str], worker: str) -> bool:
    """True once some job of ``ids`` runs under ``worker``: a claim of that worker holds
    it (the claim hash names its worker, "w", and its jobs; a running record does not)."""
    for tag in {shard_of_job(job_id) for job_id in ids}:
        for token in q.client.zrange(q.keys.leases(tag), 0, -1):
            held = q.client.hgetall(q.keys.claim(tag, token))
            if held.get("w") == worker and any(job_id in held for job_id in ids):
                return True
    return False


def check_results(q: Queue, ids: list[str], values: list[object]) -> list[str]:
    """Every job done with its own output; returns the worker that wrote each."""
    writers = []
    for job_id, value in zip(ids, values, strict=True):
        view = q.get(job_id)
        assert view is not None and view.status is JobStatus.DONE, (job_id, view)
        assert view.result == expected_result({"value": value, "size": 1})
        assert view.batch is not None
        writers.append(str(view.batch["worker"]))
    return writers


def attempts(q: Queue, job_id: str) -> int:
    return attempts_of(q, job_id)


def test_killed_worker_jobs_complete_exactly_once_within_the_lease_plus_a_bound(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str,
        tmp_path: Path) -> None:
    values: list[object] = list(range(12))
    ids = admit_jobs(fq, spec, values)
    done = DoneCounter(fq.client, fq.keys.done_channel)
    try:
        with start_worker(env_for(server, key_prefix, SLOW), "w1@fault") as w1:
            wait_until(lambda: held_by(fq, ids, "w1@fault"), 30, "w1 to hold a batch")
            w1.send_signal(signal.SIGKILL)
            w1.wait(10)
        clock = Stopwatch()
        assert_one_place(fq.client, fq.keys, ids)  # leased to a dead worker: still placed
        with start_worker(env_for(server, key_prefix, FAST), "w2@fault"):
            def recovered() -> bool:
                assert_one_place(fq.client, fq.keys, ids)  # at every look, not just at the end
                return all_final(fq, ids)

            wait_until(recovered, LEASE_MS / 1000 + TICK_S + RECOVERY_SLACK_S,
                       "every job of the killed worker to complete")
            recovery_s = clock.s()
        counts = done.counted(ids)
    finally:
        done.close()
    assert counts == {job_id: 1 for job_id in ids}  # each result written exactly once
    assert set(check_results(fq, ids, values)) == {"w2@fault"}
    assert all(attempts(fq, i) == 2 for i in ids)
    record("worker kill -9 holding a batch of 12", jobs=12, lost=0, duplicated=0,
           lease_ms=LEASE_MS, recovery_s=recovery_s)


def test_a_worker_restarted_under_its_name_takes_its_claims_back_and_reruns_the_batch_whole(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str) -> None:
    # A lease far longer than this test may wait: only the restarted worker ending its
    # predecessor's leases at start can bring the jobs back in time.
    long_lease = {"CARPOOL_LEASE_MS": str(600_000)}
    values: list[object] = list(range(8))
    ids = admit_jobs(fq, spec, values)
    with start_worker({**env_for(server, key_prefix, SLOW), **long_lease}, "w1@restart") as w1:
        wait_until(lambda: held_by(fq, ids, "w1@restart"), 30, "w1 to hold the batch")
        w1.send_signal(signal.SIGKILL)
        w1.wait(10)
    with start_worker({**env_for(server, key_prefix, FAST), **long_lease}, "w1@restart"):
        wait_until(lambda: all_final(fq, ids), RECOVERY_SLACK_S,
                   "the restarted worker to finish its predecessor's batch")
    assert set(check_results(fq, ids, values)) == {"w1@restart"}
    assert all(attempts(fq, i) == 2 for i in ids)
    # Retried whole once: the dead worker's batch ran again as one batch, not one by one.
    assert {(v.batch or {}).get("size") for v in map(fq.get, ids) if v} == {8}


def test_frozen_worker_past_its_lease_cannot_overwrite_the_second_workers_results(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str,
        tmp_path: Path) -> None:
    values: list[object] = [f"v{i}" for i in range(6)]
    ids = admit_jobs(fq, spec, values)
    w1_log = tmp_path / "w1.log"
    done = DoneCounter(fq.client, fq.keys.done_channel)
    try:
        with start_worker(env_for(server, key_prefix, SLOW), "w1@fault", log_path=w1_log) as w1:
            wait_until(lambda: held_by(fq, ids, "w1@fault"), 30, "w1 to hold a batch")
            w1.send_signal(signal.SIGSTOP)
            clock = Stopwatch()
            try:
                with start_worker(env_for(server, key_prefix, FAST), "w2@fault"):
                    wait_until(lambda: all_final(fq, ids), RECOVERY_SLACK_S,
                               "w2 to finish the frozen worker's jobs")
                    taken_over_s = clock.s()
            finally:
                w1.send_signal(signal.SIGCONT)
            wait_until(lambda: log_says(w1_log, "refused: lease lost"), 30,
                       "w1 to wake, finish its batch and be refused")
        counts = done.counted(ids)
    finally:
        done.close()
    assert set(check_results(fq, ids, values)) == {"w2@fault"}
    assert counts == {job_id: 1 for job_id in ids}
    assert_one_place(fq.client, fq.keys, ids)
    record("worker SIGSTOP past its lease, then SIGCONT", jobs=6, lost=0, duplicated=0,
           late_writes_refused=6, taken_over_s=taken_over_s)


def test_poison_input_is_retried_up_to_max_attempts_then_fails_and_its_batch_completes(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str,
        tmp_path: Path) -> None:
    values: list[object] = [0, 1, 2, POISON_VALUE, 4, 5, 6, 7]
    ids = admit_jobs(fq, spec, values)
    poison = ids[3]
    env = env_for(server, key_prefix, FAST, CARPOOL_SYNTHETIC_POISON="1",
                  CARPOOL_MAX_ATTEMPTS="3")
    crashes = 0
    clock = Stopwatch()
    for start in range(6):  # 3 crashes, then one worker that finishes: 4 starts expected
        proc = spawn_worker(env, f"w{start}@poison", tmp_path / f"w{start}.log")
        try:
            wait_until(lambda p=proc: p.poll() is not None or all_final(fq, ids),  # type: ignore[misc]
                       RECOVERY_SLACK_S, "the worker to crash or every job to end")
            if proc.poll() is None:
                break
            assert proc.returncode == POISON_EXIT_STATUS
            crashes += 1
        finally:
            stop_process(proc)
    assert crashes == 3
    view = fq.get(poison)
    assert view is not None and view.status is JobStatus.FAILED
    assert view.error is not None and "worker lost 3 times" in view.error
    leases = Leases(fq.client, fq.keys, load_catalogue(None))
    assert leases.dead_letters() == [poison]
    others = [i for i in ids if i != poison]
    check_results(fq, others, [v for v in values if v != POISON_VALUE])
    assert_one_place(fq.client, fq.keys, ids)
    record("poison input kills its worker (os._exit) in a batch of 8", jobs=8, crashes=crashes,
           poison_status="failed", others_done=7, total_s=clock.s())


def test_a_sticky_cuda_error_hands_the_batch_back_ends_the_worker_and_fails_its_input_alone(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str,
        tmp_path: Path) -> None:
    values: list[object] = [0, 1, 2, DEVICE_ASSERT_VALUE, 4, 5, 6, 7]
    ids = admit_jobs(fq, spec, values)
    bad = ids[3]
    # A lease far longer than the test: jobs come back only because they were handed back.
    env = make_env(server.url, key_prefix, CARPOOL_LEASE_MS="600000",
                   CARPOOL_SYNTHETIC_COST_MS=FAST, CARPOOL_MODELS="synthetic",
                   CARPOOL_SYNTHETIC_POISON="1", CARPOOL_MAX_ATTEMPTS="2")
    exits = []
    for start in range(4):  # 2 exits, then one worker that finishes
        log = tmp_path / f"w{start}.log"
        proc = spawn_worker(env, f"w{start}@sticky", log)
        try:
            wait_until(lambda p=proc: p.poll() is not None or all_final(fq, ids),  # type: ignore[misc]
                       RECOVERY_SLACK_S, "the worker to exit or every job to end")
            if proc.poll() is None:
                break
            exits.append(proc.returncode)
            assert log_says(log, "the CUDA context is lost"), log.read_text()[-2000:]
            if start == 0:  # no innocent job failed for it: the batch went back whole
                assert all(s is not JobStatus.FAILED for s in statuses(fq, ids).values())
        finally:
            stop_process(proc)
    assert exits == [EXIT_DEVICE_LOST, EXIT_DEVICE_LOST]
    view = fq.get(bad)
    assert view is not None and view.status is JobStatus.FAILED
    others = [i for i in ids if i != bad]
    check_results(fq, others, [v for v in values if v != DEVICE_ASSERT_VALUE])
    assert_one_place(fq.client, fq.keys, ids)


def test_sigterm_past_the_grace_period_hands_the_batch_back_and_nothing_is_stuck(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str) -> None:
    values: list[object] = list(range(4))
    ids = admit_jobs(fq, spec, values)
    env = env_for(server, key_prefix, "8000,0", CARPOOL_STOP_GRACE_S="1")
    with start_worker(env, "w1@fault") as w1:
        wait_until(lambda: held_by(fq, ids, "w1@fault"), 30, "w1 to hold a batch")
        clock = Stopwatch()
        w1.send_signal(signal.SIGTERM)
        assert w1.wait(30) == 0
        exit_s = clock.s()
    assert set(statuses(fq, ids).values()) == {JobStatus.QUEUED}
    assert fq.client.zrange(fq.keys.bin("synthetic", "small"), 0, -1) == ids  # front, in order
    assert fq.client.zcard(fq.keys.leases(shard("synthetic"))) == 0
    assert_one_place(fq.client, fq.keys, ids)
    with start_worker(env_for(server, key_prefix, FAST), "w2@fault"):
        wait_until(lambda: all_final(fq, ids), 30, "w2 to run the handed-back jobs")
    assert set(check_results(fq, ids, values)) == {"w2@fault"}
    record("worker SIGTERM while an 8 s batch runs, grace 1 s", jobs=4, lost=0,
           handed_back=4, exit_s=exit_s)


def test_a_batch_longer_than_its_lease_keeps_it_by_renewal(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str) -> None:
    env = env_for(server, key_prefix, "4000,0")  # a batch lasts 2.7 leases
    with start_worker(env, "w1@renew"), start_worker(env, "w2@renew"):
        values: list[object] = list(range(6))
        ids = admit_jobs(fq, spec, values)
        done = DoneCounter(fq.client, fq.keys.done_channel)
        try:
            wait_until(lambda: all_final(fq, ids), 60, "the long batches to finish")
            counts = done.counted(ids)
        finally:
            done.close()
    check_results(fq, ids, values)
    assert [attempts(fq, i) for i in ids] == [1] * len(ids)  # never taken back
    assert counts == {job_id: 1 for job_id in ids}


def test_garbage_written_straight_into_redis_fails_alone_and_the_worker_lives(
        server: RedisProc, fq: Queue, spec: ModelSpec, key_prefix: str) -> None:
    good = admit_jobs(fq, spec, ["ok-1", "ok-2"])
    bin_spec = spec.bin_for(1)
    bad_inputs = ["not json", "[1, 2]", json.dumps({"size": "big"}), "{" * 10_000,
                  json.dumps({"value": 1})]
    bad = [single_admitted(Admissions(fq.client, fq.keys).admit(AdmitRequest(
        spec, (AdmitJob(bin_spec, new_job_id(spec.name), text),), queued_ttl_s=600))).id
           for text in bad_inputs]
    with start_worker(env_for(server, key_prefix, FAST), "w1@garbage") as w1:
        wait_until(lambda: all_final(fq, good + bad), 30, "every job to end")
        assert w1.poll() is None
        later = admit_jobs(fq, spec, ["after"])
        wait_until(lambda: all_final(fq, later), 30, "a job after the garbage")
    check_results(fq, good + later, ["ok-1", "ok-2", "after"])
    for job_id in bad:
        view = fq.get(job_id)
        assert view is not None and view.status is JobStatus.FAILED
        assert view.error is not None and view.error.startswith("preprocess failed")

