"""Redis crashes, restarts, loads, fills up, hangs or asks for a password: the web
answers 503 with Retry-After (never 500) and recovers by itself, workers reconnect,
and no acknowledged job is lost or half-admitted. Private redis-servers only.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import JobStatus, Outcome
from carpool.core.settings import load_settings
from carpool.core.synthetic import expected_result
from tests.conftest import make_env
from tests.support.faults import (
    Stopwatch,
    all_final,
    assert_one_place,
    record,
    spawn_worker,
    stop_process,
)
from tests.support.procs import (
    WORKER_START_TIMEOUT_S,
    log_says,
    start_web,
    start_worker,
    wait_until,
)
from tests.support.redisproc import RedisProc, newest_redis, private_redis, redis_servers
from tests.support.webtools import web_client
from web.app import check_redis_durability

PASSWORD = "test-password-0123456789abcdef"
DURABLE = ("--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory", "256mb",
           "--maxmemory-policy", "noeviction")
#: Requests sent while Redis is down: each must answer 503, none 500.
REQUESTS_WHILE_DOWN = 20


def job(i: Any, size: int = 1) -> dict[str, Any]:
    return {"model": "synthetic", "input": {"value": i, "size": size}}


def fq_for(server: RedisProc, prefix: str) -> Queue:
    return Queue(connect(server.url), Keys(prefix))


def assert_503(r: requests.Response | Any) -> None:
    assert r.status_code == 503, (r.status_code, r.text if hasattr(r, "text") else r.data)
    assert int(r.headers["Retry-After"]) >= 1
    body = r.json() if hasattr(r, "json") and callable(r.json) else r.get_json()
    assert body["error"]["code"] == "backend_unavailable"


@pytest.fixture
def aof_redis() -> Iterator[RedisProc]:
    with private_redis(*DURABLE, password=PASSWORD) as server:
        yield server


def test_redis_killed_with_jobs_queued_and_leased_loses_nothing_and_web_answers_503_meanwhile(
        aof_redis: RedisProc, key_prefix: str) -> None:
    env = make_env(aof_redis.url, key_prefix, CARPOOL_LEASE_MS="3000",
                   CARPOOL_SYNTHETIC_COST_MS="1500,0")
    fq = fq_for(aof_redis, key_prefix)
    codes: Counter[int] = Counter()
    with start_web(env) as base, start_worker({**env, "CARPOOL_MODELS": "synthetic"}), \
            requests.Session() as s:
        ids = [s.post(f"{base}/submit", json=job(i), timeout=10).json()["id"]
               for i in range(60)]

        def leased_and_queued() -> bool:
            states = Counter(v.status if v else None for v in fq.get_many(ids))
            return states["running"] > 0 and states["queued"] > 0

        wait_until(leased_and_queued, 30, "some jobs leased and some queued")
        aof_redis.kill()
        clock = Stopwatch()
        for i in range(REQUESTS_WHILE_DOWN):
            for r in (s.post(f"{base}/submit", json=job(f"down-{i}"), timeout=10),
                      s.get(f"{base}/result/{ids[i]}", timeout=10),
                      s.get(f"{base}/readyz", timeout=10)):
                codes[r.status_code] += 1
                assert_503(r)
        aof_redis.restart()
        down_s = clock.s()
        lost = [i for i in ids if fq.get(i) is None]
        assert lost == []  # every acknowledged submit survived the crash (AOF)

        def web_admits() -> bool:
            r = s.post(f"{base}/submit", json=job("after"), timeout=10)
            codes[r.status_code] += 1
            if r.status_code == 202:
                ids.append(r.json()["id"])
                return True
            assert_503(r)
            return False

        wait_until(web_admits, 30, "the web to admit again")
        web_back_s = clock.s() - down_s
        wait_until(lambda: all_final(fq, ids), 60, "every job to complete after the restart")
        all_done_s = clock.s() - down_s
    assert codes[500] == 0 and set(codes) <= {202, 503}
    views = {i: fq.get(i) for i in ids}
    assert {v.status for v in views.values() if v is not None} == {JobStatus.DONE}
    assert views[ids[0]].result == expected_result({"value": 0, "size": 1})  # type: ignore[union-attr]
    drained = int(fq.client.hget(fq.keys.stats("synthetic", "small"), "drained") or 0)
    assert drained == len(ids)  # each result written exactly once
    assert_one_place(fq.client, fq.keys, ids)
    record("Redis kill -9 (AOF everysec) with jobs queued and leased", jobs=len(ids), lost=0,
           duplicated=drained - len(ids), answers_while_down=dict(codes),
           web_recovered_s=round(web_back_s, 2), all_done_after_restart_s=round(all_done_s, 2))


def test_redis_loading_its_dataset_answers_503_then_recovers(key_prefix: str) -> None:
    if "7" not in redis_servers():
        pytest.skip("key-load-delay needs Redis 7")
    with private_redis("--appendonly", "no") as server:
        fq = fq_for(server, key_prefix)
        env = make_env(server.url, key_prefix)
        with start_web(env) as base, requests.Session() as s:
            first = s.post(f"{base}/submit", json=job(1), timeout=10).json()["id"]
            with server.client() as c:  # enough keys that loading them takes seconds
                for start in range(0, 20_000, 5_000):
                    c.mset({f"filler:{i}": "x" for i in range(start, start + 5_000)})
                c.save()
            server.stop()
            server.args += ["--key-load-delay", "100",
                            "--loading-process-events-interval-bytes", "1024"]
            server.proc = subprocess.Popen(
                [server.binary, "--port", str(server.port), "--dir", str(server.dir),
                 "--save", "", "--logfile", "redis.log", *server.args], cwd=server.dir)
            clock = Stopwatch()
            seen: Counter[int] = Counter()

            def serving() -> bool:
                r = s.post(f"{base}/submit", json=job(2), timeout=10)
                seen[r.status_code] += 1
                if r.status_code != 202:
                    assert_503(r)
                return r.status_code == 202

            wait_until(serving, 60, "the web to admit once Redis has loaded")
            loaded_s = clock.s()
            assert fq.get(first) is not None
        assert seen[503] >= 1 and seen[500] == 0
        record("Redis restarting, LOADING 20k keys", answers=dict(seen), web_recovered_s=loaded_s)


@pytest.mark.parametrize("version", sorted(redis_servers()))
def test_redis_out_of_memory_answers_503_and_never_leaves_a_half_admitted_job(
        version: str, key_prefix: str, tmp_path: Path) -> None:
    with private_redis("--maxmemory-policy", "noeviction",
                       binary=redis_servers()[version]) as server:
        with server.client() as c:
            used = int(c.info("memory")["used_memory"])
            c.config_set("maxmemory", used + 3_000_000)
        settings = load_settings(make_env(server.url, key_prefix))
        fq = fq_for(server, key_prefix)
        admitted: list[str] = []
        big = "x" * 60_000
        with web_client(settings) as http:
            for i in range(200):
                r = http.post("/submit", json=job(f"{i}-{big}"))
                if r.status_code != 202:
                    break
                admitted.append(r.get_json()["id"])
            assert_503(r)
            assert "out of memory" in r.get_json()["error"]["message"]
            r = http.post("/submit", json=job(f"keyed-{big}"), headers={"Idempotency-Key": "k"})
            assert_503(r)  # the same size: refused before any write (Redis checks at start)
            assert_one_place(fq.client, fq.keys, admitted)  # no job hash without its bin slot
            assert fq.client.keys(fq.keys.idempotency("synthetic", "*")) == []
            _drain_under_oom(fq, admitted)
            assert http.post("/submit", json=job("again")).status_code == 202  # recovered
    record(f"Redis {version} out of memory (noeviction), 60 KB inputs",
           admitted_before_503=len(admitted), half_admitted=0,
           completions_under_oom="written", admits_after_drain=202)


def _drain_under_oom(fq: Queue, admitted: list[str]) -> None:
    """Renew, reap and complete still work while Redis refuses admissions (they free memory)."""
    spec = load_catalogue(None).get("synthetic")
    leases = Leases(fq.client, fq.keys, load_catalogue(None))
    lost = fq.claim(spec, "small", 2, lease_ms=0, token="lost", worker="w")
    assert leases.reap(3).requeued == 2  # back to the front, under OOM
    claim = fq.claim(spec, "small", 10, lease_ms=60_000, token="t", worker="w")
    assert leases.renew("t", [j.id for j in claim.jobs], 60_000) == [True] * 10
    outcomes = [Outcome(j.id, result={"n": 1}) for j in claim.jobs]
    assert fq.complete(spec, claim, outcomes, {"size": 10}).written == [True] * 10
    assert {j.id for j in lost.jobs} <= {j.id for j in claim.jobs}
    assert_one_place(fq.client, fq.keys, admitted)


def test_a_hung_redis_answers_503_after_the_socket_timeout_then_recovers(
        key_prefix: str) -> None:
    with private_redis() as server:
        settings = load_settings(make_env(server.url, key_prefix))
        with web_client(settings) as http:
            assert http.post("/submit", json=job(1)).status_code == 202
            server.signal(signal.SIGSTOP)
            try:
                clock = Stopwatch()
                assert_503(http.post("/submit", json=job(2)))
                hung_s = clock.s()
            finally:
                server.signal(signal.SIGCONT)
            wait_until(lambda: http.post("/submit", json=job(3)).status_code == 202, 30,
                       "the web to admit once Redis answers again")
    record("Redis SIGSTOP (hung)", answer=503, answered_after_s=hung_s)


@pytest.mark.parametrize("url_auth", ["", ":wrong-password@"])
def test_a_missing_or_wrong_redis_password_answers_503_without_leaking_it(
        url_auth: str, key_prefix: str) -> None:
    with private_redis(password=PASSWORD) as server:
        url = f"redis://{url_auth}127.0.0.1:{server.port}/0"
        with web_client(load_settings(make_env(url, key_prefix))) as http:
            for r in (http.post("/submit", json=job(1)), http.get("/readyz")):
                assert_503(r)
                assert "wrong-password" not in r.get_data(as_text=True)


def test_a_restarted_redis_has_forgotten_the_scripts_and_they_reload(key_prefix: str) -> None:
    with private_redis() as server:
        settings = load_settings(make_env(server.url, key_prefix))
        with web_client(settings) as http:
            assert http.post("/submit", json=job(1)).status_code == 202
            with server.client() as c:
                c.script_flush()
            assert http.post("/submit", json=job(2)).status_code == 202


def _web_log_after_start(env: dict[str, str]) -> str:
    with pytest.raises(RuntimeError) as info, start_web(env):
        pass
    return str(info.value)


def test_web_and_worker_refuse_to_start_on_a_redis_without_aof_when_durability_is_required(
        key_prefix: str, tmp_path: Path) -> None:
    with private_redis("--appendonly", "no", "--maxmemory", "64mb") as server:
        env = make_env(server.url, key_prefix, CARPOOL_REQUIRE_DURABLE="1")
        log = _web_log_after_start(env)
        assert "Worker failed to boot" in log and "appendonly no" in log
        worker_log = tmp_path / "worker.log"
        proc = spawn_worker(env, "w1@durable", worker_log)
        assert proc.wait(60) != 0
        assert "CARPOOL_REQUIRE_DURABLE=1" in worker_log.read_text()


def test_web_and_worker_warn_about_a_redis_without_aof_and_serve(
        key_prefix: str, tmp_path: Path, client_session: requests.Session) -> None:
    with private_redis("--appendonly", "no", "--maxmemory", "64mb") as server:
        env = make_env(server.url, key_prefix)
        worker_log = tmp_path / "worker.log"
        with start_web(env) as base, start_worker(env, "w1@warn", log_path=worker_log):
            r = client_session.post(f"{base}/submit", json=job(1), timeout=10)
            job_id = r.json()["id"]
            view = client_session.get(f"{base}/result/{job_id}?wait=20", timeout=30).json()
            assert view["status"] == "done"
        assert "appendonly no" in worker_log.read_text()
        with web_client(load_settings(env)) as http:
            assert any("appendonly no" in p for p in check_redis_durability(http.application))


@pytest.fixture
def client_session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s



def test_a_worker_started_while_redis_is_down_waits_and_serves_once_it_is_up(
        key_prefix: str, tmp_path: Path) -> None:
    """It used to exit 1 with a traceback: under a supervisor, a crash loop that outlived
    a Redis start; what it waits on, and for how long, is in its log."""
    server = RedisProc(newest_redis(), DURABLE, None)  # its port chosen, not started
    env = make_env(server.url, key_prefix, CARPOOL_MODELS="synthetic",
                   CARPOOL_SYNTHETIC_COST_MS="20,1")
    log = tmp_path / "worker.log"
    proc = spawn_worker(env, "w1@redis-later", log)
    try:
        wait_until(lambda: proc.poll() is not None or log_says(log, "waiting for Redis"),
                   WORKER_START_TIMEOUT_S, "the worker to say it waits for Redis")
        assert proc.poll() is None, log.read_text()[-3000:]
        server.start()
        fq = fq_for(server, key_prefix)
        wait_until(lambda: proc.poll() is not None or log_says(log, "w1@redis-later ready."),
                   WORKER_START_TIMEOUT_S, "the worker to be ready once Redis is up")
        assert proc.poll() is None, log.read_text()[-3000:]
        with start_web(env) as base:
            r = requests.post(f"{base}/submit?wait=30", json=job(1), timeout=60)
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        assert "durability not checked" not in log.read_text()  # checked once Redis was up
        fq.client.close()
    finally:
        stop_process(proc)
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)
