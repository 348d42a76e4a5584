"""Rollouts on a real Redis through the web app: the share of jobs naming no version
that a rollout sends to its version (exactly what the seeded draws say), pinned jobs
left where they are, the state in GET /models, a rollback seen at once by the process
that made it and within ROLLOUT_REFRESH_S by another, a retiring version refused and
its drain counted, and the admin-only rule."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.keys import Keys
from carpool.core.jobs import Outcome
from carpool.core.rollouts import RETIRE_SETTLE_MS, ROLLOUT_REFRESH_S
from carpool.core.settings import Settings, load_settings
from carpool.core.synthetic import expected_result
from tests.conftest import make_env
from tests.support.procs import wait_until
from tests.support.webtools import app_state, web_client
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.loop import BatchLoop

#: synthetic's versions 2 and 3: the same model, told apart by their version alone.
VERSIONS_TOML = """
[models.synthetic.versions.2]
result_ttl_s = 120
[models.synthetic.versions.3]
result_ttl_s = 121
"""
ADMIN = "ops-key-0123456789abcdef01234"
ALICE = "alice-key-0123456789abcdef01"
SEED = 7
#: Jobs submitted to measure a share: enough that 30 % of them is not a fluke.
JOBS = 400


def settings_for(redis_url: str, key_prefix: str, tmp_path: Path, **extra: str) -> Settings:
    config = tmp_path / "catalogue.toml"
    config.write_text(VERSIONS_TOML)
    return load_settings(make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config), **extra))


@pytest.fixture
def settings(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    return settings_for(redis_url, key_prefix, tmp_path)


@pytest.fixture
def http(settings: Settings, client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(settings) as c:
        app_state(c).routing.rng = random.Random(SEED)
        yield c


def put(http: FlaskClient, body: Any, model: str = "synthetic", **kw: Any) -> Any:
    return http.put(f"/models/{model}/rollout", json=body, **kw)


def submit(http: FlaskClient, model: str = "synthetic", value: Any = 0) -> dict[str, Any]:
    resp = http.post("/submit", json={"model": model, "input": {"value": value, "size": 5}})
    assert resp.status_code == 202, resp.get_json()
    body: dict[str, Any] = resp.get_json()
    return body


def rollout_shown(http: FlaskClient) -> dict[str, Any] | None:
    models = http.get("/models").get_json()["models"]
    entry = next(m for m in models if m["name"] == "synthetic")
    shown: dict[str, Any] | None = entry.get("rollout")
    return shown


def test_a_rollout_sends_exactly_the_drawn_share_of_unnamed_jobs_to_its_version(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    assert put(http, {"version": "2", "percent": 30}).status_code == 200
    versions = [submit(http, value=i)["model_version"] for i in range(JOBS)]
    draws = random.Random(SEED)  # the app's draws: one per request
    assert versions == ["2" if draws.random() * 100 < 30 else "1" for _ in range(JOBS)]
    assert 0.25 < versions.count("2") / JOBS < 0.35
    assert client.zcard(keys.bin("synthetic@2", "small")) == versions.count("2")
    assert client.zcard(keys.bin("synthetic", "small")) == versions.count("1")


def test_pinned_jobs_and_whole_requests_keep_one_version(http: FlaskClient) -> None:
    put(http, {"version": "2", "percent": 50})
    assert {submit(http, "synthetic@1")["model_version"] for _ in range(20)} == {"1"}
    assert {submit(http, "synthetic@3")["model_version"] for _ in range(20)} == {"3"}
    many = [{j["model_version"] for j in http.post("/submit/batch", json={
        "model": "synthetic", "inputs": [{"value": i, "size": 3} for i in range(8)]}
        ).get_json()["jobs"]} for _ in range(10)]
    assert all(len(versions) == 1 for versions in many)  # one request, one version
    assert {v for versions in many for v in versions} == {"1", "2"}


def test_v2_infer_follows_the_rollout_unless_the_path_or_body_names_a_version(
        http: FlaskClient, settings: Settings) -> None:
    put(http, {"version": "2", "percent": 100})
    handlers = {m: SyntheticHandler(settings.catalogue.get(m), (1.0, 0.1))
                for m in ("synthetic", "synthetic@2", "synthetic@3")}
    loop = BatchLoop(settings, app_state(http).queue, dict(handlers), "w-rollouts")
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    row = [{"name": "VALUE", "datatype": "FP32", "shape": [1, 2], "data": [[1.0, 2.0]]}]
    try:
        answers = [http.post(path, json={"inputs": row, **extra}) for path, extra in (
            ("/v2/models/synthetic/infer", {}),
            ("/v2/models/synthetic/infer", {"model_version": "3"}),
            ("/v2/models/synthetic/versions/1/infer", {}))]
    finally:
        loop.stop()
        thread.join(10)
    assert [a.status_code for a in answers] == [200] * 3, [a.get_json() for a in answers]
    assert [a.get_json()["model_version"] for a in answers] == ["2", "3", "1"]


def test_at_0_and_100_percent_every_unnamed_job_goes_to_one_version(
        http: FlaskClient) -> None:
    put(http, {"version": "2", "percent": 0})
    assert {submit(http)["model_version"] for _ in range(50)} == {"1"}
    put(http, {"version": "2", "percent": 100})
    assert {submit(http)["model_version"] for _ in range(50)} == {"2"}
    embed = http.post("/submit/batch", json={"model": "synthetic", "inputs": [{"value": 1,
                                                                              "size": 1}]})
    assert embed.get_json()["jobs"][0]["model_version"] == "2"


def test_get_models_shows_the_rollout_on_the_models_own_entry(http: FlaskClient) -> None:
    assert rollout_shown(http) is None
    put(http, {"version": "2", "percent": 25})
    answer = put(http, {"shadow": "3", "percent": 5}).get_json()
    expected = {"version": "2", "percent": 25.0, "shadow": "3", "shadow_percent": 5.0,
                "shadow_counts": {}, "retiring": []}
    assert answer == {"model": "synthetic", "rollout": expected}
    assert rollout_shown(http) == expected
    models = http.get("/models").get_json()["models"]
    assert all("rollout" not in m for m in models if m["name"] != "synthetic")


def test_a_rollback_is_at_once_here_and_within_the_refresh_in_another_process(
        http: FlaskClient, settings: Settings) -> None:
    put(http, {"version": "2", "percent": 100})
    now = [1000.0]
    with web_client(settings) as other:
        cache = app_state(other).routing.cache
        cache.clock = lambda: now[0]
        assert submit(other)["model_version"] == "2"  # its view: read now
        assert http.delete("/models/synthetic/rollout").status_code == 200
        assert {submit(http)["model_version"] for _ in range(20)} == {"1"}
        now[0] += ROLLOUT_REFRESH_S * 0.9
        assert submit(other)["model_version"] == "2"  # its view, younger than the refresh
        now[0] += ROLLOUT_REFRESH_S * 0.2
        assert {submit(other)["model_version"] for _ in range(20)} == {"1"}
    assert rollout_shown(http) is None


def drains(http: FlaskClient) -> dict[str, dict[str, Any]]:
    shown = rollout_shown(http)
    return {r["version"]: r for r in (shown or {}).get("retiring", [])}


def test_a_retiring_version_admits_nothing_new_and_counts_its_jobs_until_they_end(
        http: FlaskClient, settings: Settings) -> None:
    queue = app_state(http).queue
    v2 = settings.catalogue.get("synthetic@2")
    pinned = [submit(http, "synthetic@2", value=i)["id"] for i in range(5)]
    shown = put(http, {"retire": "2"}).get_json()["rollout"]["retiring"]
    assert [(r["version"], r["state"], r["queued"], r["running"]) for r in shown] == [
        ("2", "draining", 5, 0)]
    refused = http.post("/submit", json={"model": "synthetic@2", "input": {"value": 1,
                                                                            "size": 1}})
    assert refused.status_code == 503
    assert refused.get_json()["error"]["code"] == "model_unavailable"
    assert "is retiring: it admits no new jobs" in refused.get_json()["error"]["message"]
    assert http.post("/v1/embeddings", json={"model": "synthetic@2", "input": "x"}
                     ).status_code == 503
    claim = queue.claim(v2, "small", 3, lease_ms=60_000, token="w:1", worker="w")
    assert (drains(http)["2"]["queued"], drains(http)["2"]["running"]) == (2, 3)
    queue.complete(v2, claim, [Outcome(j.id, result=1) for j in claim.jobs], {"size": 3})
    rest = queue.claim(v2, "small", 10, lease_ms=60_000, token="w:2", worker="w")
    assert drains(http)["2"]["state"] == "draining"  # 2 still running
    queue.complete(v2, rest, [Outcome(j.id, result=1) for j in rest.jobs], {"size": 2})
    assert {j.id for j in claim.jobs + rest.jobs} == set(pinned)  # the pinned jobs finish
    wait_until(lambda: drains(http)["2"]["state"] == "retired",
               RETIRE_SETTLE_MS / 1000 + 10, "version 2 to count as retired")
    assert (drains(http)["2"]["queued"], drains(http)["2"]["running"]) == (0, 0)


def test_a_retired_version_is_unloaded_once_and_a_later_load_is_kept(
        http: FlaskClient, settings: Settings) -> None:
    repository = app_state(http).repository
    assert repository.read(["synthetic@2"])["synthetic@2"].loaded
    put(http, {"retire": "2"})
    assert drains(http)["2"]["state"] == "draining"
    assert repository.read(["synthetic@2"])["synthetic@2"].loaded  # not before it drained
    wait_until(lambda: drains(http)["2"]["state"] == "retired",
               RETIRE_SETTLE_MS / 1000 + 10, "version 2 to count as retired")
    unloaded = repository.read(["synthetic@2"])["synthetic@2"]
    assert not unloaded.loaded  # as POST /v2/repository/models/synthetic@2/unload leaves it
    index = {(r["name"], r["version"]): r for r in
             http.post("/v2/repository/index", json={}).get_json()}
    assert (index[("synthetic", "2")]["state"], index[("synthetic", "2")]["reason"]) == (
        "UNAVAILABLE", "unloaded")
    assert index[("synthetic", "1")]["state"] != "UNAVAILABLE" or (
        index[("synthetic", "1")]["reason"] != "unloaded")  # the other version untouched
    repository.load("synthetic@2", "", unloaded.generation)  # the operator's load
    assert drains(http)["2"]["state"] == "retired"
    assert repository.read(["synthetic@2"])["synthetic@2"].loaded  # not unloaded again


def test_the_entrys_own_version_retires_only_behind_a_rollout_at_100_percent(
        http: FlaskClient) -> None:
    put(http, {"version": "2", "percent": 100})
    assert put(http, {"retire": "1"}).status_code == 200
    assert drains(http)["1"]["state"] == "draining"  # younger than the settle time
    assert {submit(http)["model_version"] for _ in range(10)} == {"2"}
    pinned = http.post("/submit", json={"model": "synthetic@1", "input": {"value": 1,
                                                                           "size": 1}})
    assert pinned.status_code == 503
    assert put(http, {"version": "2", "percent": 50}).status_code == 409
    assert http.delete("/models/synthetic/rollout").status_code == 200  # reopens 1
    assert {submit(http)["model_version"] for _ in range(10)} == {"1"}
    assert rollout_shown(http) is None


@pytest.mark.parametrize("path, body, status, message", [
    ("nomodel", {"version": "2", "percent": 5}, 404, "unknown model 'nomodel'"),
    ("synthetic@2", {"version": "2", "percent": 5}, 400, "name the model, not a version"),
    ("synthetic", {"version": "7", "percent": 5}, 400, "the model's versions: 1, 2, 3"),
    ("synthetic", {"version": "2", "percent": 250}, 400, "a number from 0 to 100"),
    ("synthetic", {"version": "2", "percent": "ten"}, 400, "a number from 0 to 100"),
    ("synthetic", {"shadow": "1", "percent": 5}, 400, "a shadow must be another version"),
    ("synthetic", {"retire": "1"}, 409, "PUT a rollout at percent 100 first"),
])
def test_a_bad_change_answers_4xx_saying_why_and_changes_nothing(
        http: FlaskClient, path: str, body: Any, status: int, message: str) -> None:
    resp = put(http, body, model=path)
    assert resp.status_code == status, resp.get_json()
    assert message in resp.get_json()["error"]["message"]
    assert rollout_shown(http) is None


def test_a_body_that_is_not_json_is_a_400(http: FlaskClient) -> None:
    resp = http.put("/models/synthetic/rollout", data="version=2",
                    headers={"Content-Type": "text/plain"})
    assert resp.status_code == 400
    resp = http.put("/models/synthetic/rollout", data="{not json",
                    headers={"Content-Type": "application/json"})
    assert resp.status_code == 400


def test_only_an_admin_key_changes_a_rollout_when_keys_are_on(
        redis_url: str, tmp_path: Path, client: redis.Redis) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{ALICE}\n{ADMIN} admin\n")
    settings = settings_for(redis_url, f"test-{uuid.uuid4().hex[:12]}", tmp_path,
                            CARPOOL_API_KEYS_FILE=str(keys_file))
    body = {"version": "2", "percent": 50}
    with web_client(settings) as http:
        assert put(http, body).status_code == 401
        forged = put(http, body, headers={"Authorization": "Bearer forged-key-0123456789abc"})
        assert forged.status_code == 401
        plain = put(http, body, headers={"Authorization": f"Bearer {ALICE}"})
        assert plain.status_code == 403 and plain.get_json()["error"]["code"] == "forbidden"
        assert http.delete("/models/synthetic/rollout",
                           headers={"X-API-Key": ALICE}).status_code == 403
        assert rollout_shown_as(http, ALICE) is None
        assert put(http, body, headers={"X-API-Key": ADMIN}).status_code == 200
        assert rollout_shown_as(http, ALICE)["percent"] == 50.0  # type: ignore[index]
        assert http.delete("/models/synthetic/rollout",
                           headers={"X-API-Key": ADMIN}).status_code == 200


def rollout_shown_as(http: FlaskClient, key: str) -> dict[str, Any] | None:
    models = http.get("/models", headers={"X-API-Key": key}).get_json()["models"]
    shown: dict[str, Any] | None = next(m for m in models if m["name"] == "synthetic").get(
        "rollout")
    return shown


def complete_all(http: FlaskClient, model: str, wrong: frozenset[str] = frozenset()
                 ) -> None:
    """Claim and complete every queued job of ``model``'s small bin with the synthetic
    model's result (a wrong one for the ids in ``wrong``)."""
    state = app_state(http)
    spec = state.settings.catalogue.get(model)
    claim = state.queue.claim(spec, "small", 100, lease_ms=60_000, token=uuid.uuid4().hex,
                              worker="w")
    outcomes = [Outcome(j.id, result={"echo": "wrong"} if j.id in wrong
                        else expected_result(json.loads(j.input_json))) for j in claim.jobs]
    state.queue.complete(spec, claim, outcomes, {"size": len(claim.jobs)})


def test_a_shadow_copies_jobs_behind_interactive_ones_and_counts_agreement(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    put(http, {"shadow": "3", "percent": 100})
    served = [submit(http, value=i) for i in range(6)]
    assert {s["model_version"] for s in served} == {"1"}  # the copy is never answered
    later = submit(http, "synthetic@3", value="interactive")
    queued = client.zrange(keys.bin("synthetic@3", "small"), 0, -1)
    assert len(queued) == 7 and queued[0] == later["id"]  # the copies: the bulk level
    copies = queued[1:]
    submit(http, "synthetic@3", value="pinned to the shadow")  # a shadow's job: no copy
    assert client.zcard(keys.bin("synthetic@3", "small")) == 8
    complete_all(http, "synthetic")
    assert rollout_shown(http)["shadow_counts"] == {}  # type: ignore[index]
    complete_all(http, "synthetic@3", wrong=frozenset(copies[:2]))
    counts = rollout_shown(http)["shadow_counts"]  # type: ignore[index]
    assert counts == {"3": {"compared": 6, "agreed": 4}}
    assert client.zcard(keys.shadow_pairs("synthetic")) == 0  # each pair counted once
    assert rollout_shown(http)["shadow_counts"] == counts  # type: ignore[index]
    metrics = http.get("/metrics").get_data(as_text=True)
    assert 'carpool_shadow_compared_total{model="synthetic",version="3"} 6.0' in metrics
    assert 'carpool_shadow_agreed_total{model="synthetic",version="3"} 4.0' in metrics
    for job in served:  # the caller's document is the served job's, its result its own
        found = http.get(f"/result/{job['id']}").get_json()
        assert (found["model_version"], found["status"]) == ("1", "done")


def test_a_shadow_at_0_percent_copies_nothing(http: FlaskClient, client: redis.Redis,
                                              keys: Keys) -> None:
    put(http, {"shadow": "3", "percent": 0})
    for i in range(20):
        submit(http, value=i)
    assert client.zcard(keys.bin("synthetic@3", "small")) == 0


def keyed(http: FlaskClient, key: str, value: Any = 0) -> dict[str, Any]:
    resp = http.post("/submit", json={"model": "synthetic", "input": {"value": value,
                                                                       "size": 5}},
                     headers={"Idempotency-Key": key})
    assert resp.status_code == 202, resp.get_json()
    body: dict[str, Any] = resp.get_json()
    return body


def test_a_retry_with_an_idempotency_key_finds_its_job_whatever_the_percent(
        http: FlaskClient) -> None:
    put(http, {"version": "2", "percent": 50})
    first = {f"key-{i}": keyed(http, f"key-{i}") for i in range(40)}
    assert {j["model_version"] for j in first.values()} == {"1", "2"}
    for percent in (50, 10, 90, 100):  # a ramp moves no retry to another version
        put(http, {"version": "2", "percent": percent})
        for key, job in first.items():
            again = keyed(http, key)
            assert (again["id"], again["duplicate"]) == (job["id"], True), (percent, key)
    surrogate = http.post("/submit", data='{"model": "synthetic", "input": {"value": 1, '
                          '"size": 1}, "idempotency_key": "\\ud800"}',
                          headers={"Content-Type": "application/json"})
    assert surrogate.status_code == 400



@pytest.mark.parametrize("change", [
    [None],  # the rollout removed: names no version again
    [{"version": "3", "percent": 50}],  # moved to another version
    [{"version": "2", "percent": 0}, {"retire": "2"}],  # its version retiring
], ids=["removed", "moved", "retiring"])
def test_a_retry_with_an_idempotency_key_finds_its_job_whatever_became_of_the_rollout(
        http: FlaskClient, client: redis.Redis, keys: Keys,
        change: list[dict[str, Any] | None]) -> None:
    """Not one new job for a retry: it is answered its first job, in the version that
    holds its key, even one that admits nothing new."""
    put(http, {"version": "2", "percent": 100})
    first = keyed(http, "key-r")
    assert first["model_version"] == "2"
    for body in change:
        resp = http.delete("/models/synthetic/rollout") if body is None else put(http, body)
        assert resp.status_code == 200, resp.get_json()
    again = keyed(http, "key-r")
    assert (again["id"], again["duplicate"], again["model_version"]) == (first["id"], True, "2")
    assert sum(client.zcard(keys.bin(m, "small"))
               for m in ("synthetic", "synthetic@2", "synthetic@3")) == 1
