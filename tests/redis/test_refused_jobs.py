"""Queued jobs of a model every live worker refused end "failed": at once when no live
worker is still loading it, after a grace while one is. The script on a real Redis
(fail_queued.lua), the worker's watch over the registry (a fake clock), and the
waiting reason in GET /result."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import redis

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.backend.refused_models import RefusedJobs
from carpool.backend.registry import Registry
from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import JobStatus, new_job_id
from tests.support.procs import wait_until
from tests.support.webtools import jpeg, web_client, web_settings
from worker.shell.refusal_watch import RefusalWatch

NO_WEIGHTS = "model 'imgs' has no weights: set [models.imgs.options] weights = ..."
SPEC = load_catalogue(None).get("synthetic")


def admit(queue: Queue, n: int, **extra: str) -> list[str]:
    admissions = Admissions(queue.client, queue.keys)
    return [single_admitted(admissions.admit(AdmitRequest(
        SPEC, (AdmitJob(SPEC.bins[0], new_job_id(SPEC.name), json.dumps({"value": i, "size": 1})),),
        queued_ttl_s=600, **extra))).id  # type: ignore[arg-type]
        for i in range(n)]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_the_queued_jobs_of_a_bin_end_failed_once_and_the_claimed_one_is_left_alone(
        client: redis.Redis, keys: Keys, queue: Queue) -> None:
    first = admit(queue, 1, idempotency_digest="k" * 64, input_digest="d")
    ids = first + admit(queue, 3)
    claim = queue.claim(SPEC, SPEC.bins[0].name, 1, lease_ms=5000, token="t", worker="w")
    assert [j.id for j in claim.jobs] == ids[:1]
    listener = client.pubsub()
    listener.subscribe(keys.done_channel)
    assert client.exists(keys.queued_bytes(SPEC.name))
    jobs = RefusedJobs(client, keys)
    assert jobs.fail_queued(SPEC, "model_unavailable: no worker will") == 3
    assert jobs.fail_queued(SPEC, "model_unavailable: no worker will") == 0  # once
    views = [queue.get(i) for i in ids]
    assert views[0] is not None and views[0].status is JobStatus.RUNNING
    for view in views[1:]:
        assert view is not None and view.status is JobStatus.FAILED
        assert view.to_json()["error"] == "model_unavailable: no worker will"
        assert view.to_json()["error_code"] == "model_unavailable"
        assert client.ttl(keys.job(view.id)) > 0  # kept for the result TTL, then gone
    assert not client.exists(keys.queued_bytes(SPEC.name))  # the inputs left the budget
    assert client.zcard(keys.bin(SPEC.name, SPEC.bins[0].name)) == 0
    messages = []
    wait_until(lambda: bool(messages.append(listener.get_message(timeout=0.1)) or
                            any(m and m["type"] == "message" for m in messages)),
               10, "the done channel's message")
    published = next(m for m in messages if m and m["type"] == "message")["data"]
    assert sorted(str(published).split()) == sorted(ids[1:])
    listener.close()


def test_several_workers_failing_one_bin_at_once_end_each_job_exactly_once(
        client: redis.Redis, keys: Keys, queue: Queue) -> None:
    ids = admit(queue, 40)
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(
        RefusedJobs(client, keys).fail_queued(SPEC, "model_unavailable: x"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == len(ids)
    assert all(v is not None and v.status is JobStatus.FAILED for v in queue.get_many(ids))


def watching(client: redis.Redis, keys: Keys, clock: FakeClock) -> RefusalWatch:
    return RefusalWatch(Registry(client, keys), RefusedJobs(client, keys), load_catalogue(None),
                        grace_s=30.0, clock=clock)


def test_the_watch_fails_queued_jobs_at_once_when_every_live_worker_refused_and_none_loads_it(
        client: redis.Redis, keys: Keys, queue: Queue) -> None:
    registry = Registry(client, keys)
    clock = FakeClock()
    watch = watching(client, keys, clock)
    refusal = {"synthetic": "no weights here"}
    ids = admit(queue, 2)
    registry.publish("w1", [], refusal)
    registry.publish("w2", ["synthetic"], {})
    assert watch.tick(refusal) == 0  # served by w2: never failed, however long
    clock.now_s += 100
    assert watch.tick(refusal) == 0
    registry.withdraw("w2")  # the last server went: nobody will run it
    assert watch.tick(refusal) == 2  # at once: the clock has not moved
    view = queue.get(ids[0])
    assert view is not None and view.status is JobStatus.FAILED
    assert view.error == ("model_unavailable: no live worker serves model 'synthetic': "
                          "worker w1 refused it: no weights here")
    ids = admit(queue, 1)  # admitted by a web that had not seen the refusal yet
    assert watch.tick(refusal) == 1  # the next beat fails it: none waits for ever


def test_while_another_live_worker_is_still_loading_the_model_its_jobs_wait_the_grace(
        client: redis.Redis, keys: Keys, queue: Queue) -> None:
    registry = Registry(client, keys)
    clock = FakeClock()
    watch = watching(client, keys, clock)
    refusal = {"synthetic": "no weights here"}
    ids = admit(queue, 2)
    registry.publish("w1", [], refusal)
    registry.publish("w2", [], {}, loading=["synthetic"])
    assert watch.tick(refusal) == 0
    clock.now_s += 29
    assert watch.tick(refusal) == 0
    registry.publish("w2", ["synthetic"], {})  # it serves it: the grace starts again
    assert watch.tick(refusal) == 0
    registry.publish("w2", [], {}, loading=["synthetic"])  # restarted, loading again
    clock.now_s += 20
    assert watch.tick(refusal) == 0
    clock.now_s += 29
    assert watch.tick(refusal) == 0
    clock.now_s += 1
    assert watch.tick(refusal) == 2  # 30 s of refusal while it still loads: the grace ran out
    view = queue.get(ids[0])
    assert view is not None and view.status is JobStatus.FAILED and view.error is not None
    assert view.error.startswith("model_unavailable: no live worker serves model "
                                 "'synthetic': worker w1 refused it: no weights here")
    assert "CARPOOL_REFUSED_GRACE_S, 30 s" in view.error


def test_a_loading_worker_that_refuses_the_model_too_fails_its_jobs_at_once(
        client: redis.Redis, keys: Keys, queue: Queue) -> None:
    registry = Registry(client, keys)
    watch = watching(client, keys, FakeClock())
    refusal = {"synthetic": "no weights here"}
    admit(queue, 3)
    registry.publish("w1", [], refusal)
    registry.publish("w2", [], {}, loading=["synthetic", "resnet18"])
    assert watch.tick(refusal) == 0
    registry.publish("w2", [], {"synthetic": "no weights there"}, loading=["resnet18"])
    assert watch.tick(refusal) == 3  # still loading another model: no matter


def test_a_queued_job_names_what_it_waits_for_while_its_model_is_refused(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis,
        keys: Keys) -> None:
    registry = Registry(client, keys)
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_REFUSED_GRACE_S="7")
    with web_client(settings) as http:
        r = http.post("/submit?model=imgs", data=jpeg(64, 48),
                      headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 202  # no live worker: queued
        url = r.get_json()["result_url"]
        doc = http.get(url).get_json()
        assert doc["status"] == "queued"
        assert doc["waiting_for"]["state"] == "no worker"
        registry.publish("w1", ["synthetic"], {"imgs": NO_WEIGHTS})
        registry.publish("w3", [], {}, loading=["imgs"])
        wait_until(lambda: http.get(url).get_json()["waiting_for"]["state"] == "loading", 10,
                   "the web's cache to see the refusal and the loading")
        reason = http.get(url).get_json()["waiting_for"]["reason"]
        assert "still loading" in reason and NO_WEIGHTS in reason and "within 7 s" in reason
        registry.withdraw("w3")
        wait_until(lambda: http.get(url).get_json()["waiting_for"]["state"] == "refused", 10,
                   "the web's cache to see the refusal")
        reason = http.get(url).get_json()["waiting_for"]["reason"]
        assert NO_WEIGHTS in reason and "worker w1" in reason and "fail at once" in reason
        registry.publish("w2", ["imgs"], {})
        wait_until(lambda: "waiting_for" not in http.get(url).get_json(), 10,
                   "the web's cache to see a server")


@pytest.mark.parametrize("grace", ["0", "45"])
def test_the_grace_is_a_setting(grace: str, redis_url: str, key_prefix: str) -> None:
    from carpool.core.settings import load_settings
    from tests.conftest import make_env

    assert load_settings(make_env(redis_url, key_prefix, CARPOOL_REFUSED_GRACE_S=grace)
                         ).refused_grace_s == float(grace)
    assert load_settings(make_env(redis_url, key_prefix)).refused_grace_s == 30.0
