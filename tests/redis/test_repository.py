"""The repository API on a real Redis: model_state.lua's generations and its guard (two
loads at once load once), admission refusing an unloaded model, and the /v2/repository
routes: the index, a load's answer from the workers' registry entries, an unload ending
the queued jobs, bad overrides and keys refused with nothing changed; a model's versions:
one index row each, ``m`` loads and unloads them all and ``m@v`` one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend.keys import Keys
from carpool.backend.registry import Registry
from carpool.backend.repository import IN_PROGRESS, Desired, Repository
from carpool.core.settings import load_settings
from tests.conftest import make_env
from tests.support.webtools import CATALOGUE_TOML, web_client, web_settings

ADMIN, USER = "k-admin-0123456789abcdef", "k-user-0123456789abcdefgh"
LOAD, UNLOAD = "/v2/repository/models/{}/load", "/v2/repository/models/{}/unload"
#: tiny's version 2 ("tiny@2"), beside its own entry's version 1; tritonclient sends the
#: name URL-encoded.
TINY_2, TINY_2_URL = "\n[models.tiny.versions.2]\nresult_ttl_s = 120\n", "tiny%402"


@pytest.fixture
def repo(client: redis.Redis, keys: Keys) -> Repository:
    return Repository(client, keys)


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def config(doc: Any) -> dict[str, Any]:
    """A load's body as tritonclient sends it: the override as a JSON string."""
    return {"parameters": {"config": json.dumps(doc)}}


def submit(http: FlaskClient, model: str = "tiny") -> Any:
    return http.post("/submit", json={"model": model, "input": {"value": 1, "size": 1}})


def test_each_change_is_a_generation_and_a_model_never_touched_is_loaded(
        repo: Repository) -> None:
    assert repo.read(["tiny"]) == {"tiny": Desired(True, 0, "")}
    assert repo.unload("tiny") == (1, True)
    assert repo.unload("tiny") == (1, False)  # already unloaded: nothing to do
    assert repo.read(["tiny"])["tiny"] == Desired(False, 1, "")
    assert repo.load("tiny", '{"options":{"a":1}}', IN_PROGRESS) == (2, True)
    assert repo.read(["tiny"])["tiny"] == Desired(True, 2, '{"options":{"a":1}}')
    assert repo.unload("tiny") == (3, True)
    assert repo.read(["tiny"])["tiny"] == Desired(False, 3, "")  # an unload drops the override


def test_two_loads_of_one_entry_at_once_start_one_generation(repo: Repository) -> None:
    # Both callers saw generation 0 settled and load the same entry: the first starts
    # generation 1, the second joins it instead of starting a second load.
    assert repo.load("tiny", "", 0) == (1, True)
    assert repo.load("tiny", "", 0) == (1, False)
    assert repo.load("tiny", "", IN_PROGRESS) == (1, False)  # saw it in progress: joins
    # Once settled, a load of the same entry is a reload (Triton's load of a loaded model);
    # another entry always starts its own generation.
    assert repo.load("tiny", "", 1) == (2, True)
    assert repo.load("tiny", '{"options":{"a":1}}', IN_PROGRESS) == (3, True)


def test_an_unloaded_model_is_refused_at_once_and_admitted_again_once_loaded(
        http: FlaskClient, repo: Repository) -> None:
    repo.unload("tiny")
    refused = submit(http)
    assert refused.status_code == 503, refused.get_json()
    error = refused.get_json()["error"]
    assert error["code"] == "model_unavailable" and "'tiny' was unloaded" in error["message"]
    assert "Retry-After" not in refused.headers  # retrying does not help: a load does
    repo.load("tiny", "", IN_PROGRESS)
    assert submit(http).status_code == 202


def test_an_unload_ends_the_queued_jobs_with_the_reason(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    queued = [submit(http).get_json()["id"] for _ in range(2)]
    answer = http.post(UNLOAD.format("tiny"), json={"parameters": {"unload_dependents": False}})
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["queued_jobs_ended"] == 2
    for job_id in queued:
        view = http.get(f"/result/{job_id}").get_json()
        assert view["status"] == "failed" and view["error_code"] == "model_unavailable"
        assert "'tiny' was unloaded" in view["error"], view
    assert client.zcard(keys.bin("tiny", "only")) == 0


def test_the_index_lists_every_model_with_its_state_and_why(
        http: FlaskClient, client: redis.Redis, keys: Keys, repo: Repository) -> None:
    Registry(client, keys).publish("w1", ["synthetic"], {"imgs": "no weights"},
                                   generations={"synthetic": 0, "imgs": 0, "tiny": 0})
    repo.unload("tiny")
    index = {e["name"]: e for e in http.post("/v2/repository/index", data=b"").get_json()}
    assert index["synthetic"] == {"name": "synthetic", "version": "1", "state": "READY"}
    assert index["imgs"]["state"] == "UNAVAILABLE"
    assert index["imgs"]["reason"] == "worker w1 refused it: no weights"
    # w1 may serve tiny and has not acted on its unload yet: it is unloading.
    assert index["tiny"] == {"name": "tiny", "version": "1", "state": "UNAVAILABLE",
                             "reason": "unloaded"}
    assert "no live worker serves it" in index["texts"]["reason"]
    ready = http.post("/v2/repository/index", json={"ready": True}).get_json()
    assert [e["name"] for e in ready] == ["synthetic"]


def test_a_load_answers_once_a_worker_serves_it_and_with_the_reason_when_all_refused(
        http: FlaskClient, client: redis.Redis, keys: Keys, repo: Repository) -> None:
    registry = Registry(client, keys)
    # Entries as workers that acted on a later generation would publish them.
    registry.publish("w1", ["synthetic"], {"imgs": "no weights"},
                     generations={"synthetic": 99, "imgs": 99})
    served = http.post(LOAD.format("synthetic"), data=b"")
    assert served.status_code == 200 and served.get_json()["state"] == "READY"
    refused = http.post(LOAD.format("imgs"), json=config({"options": {"weights": "/x"}}))
    assert refused.status_code == 400
    assert refused.get_json()["error"] == "failed to load 'imgs': worker w1 refused it: no weights"
    assert repo.read(["imgs"])["imgs"].config == '{"options":{"weights":"/x"}}'
    # No live worker may serve tiny: the answer says so; it stays loaded.
    repo.unload("tiny")
    nobody = http.post(LOAD.format("tiny"), json={})
    assert nobody.status_code == 503 and "no live worker may serve it" in nobody.get_json()["error"]
    assert repo.read(["tiny"])["tiny"].loaded and submit(http).status_code == 202


@pytest.mark.parametrize(("body", "says"), [
    ({"parameters": {"config": "{"}}, "parameters.config: the override is not valid JSON"),
    ({"parameters": {"config": "[" * 100_000 + "]" * 100_000}}, "nested too deeply to parse"),
    ({"parameters": {"config": '{"options": {"threshold": NaN}}'}}, "NaN is not valid JSON"),
    ({"parameters": {"config": "[1]"}}, "must be a JSON object"),
    ({"parameters": {"config": "\ud800"}}, "parameters.config: the override is not valid"),
    (config({"colour": "red"}), "unknown keys ['colour']"),
    (config({"result_ttl_s": "long"}), "model 'tiny'"),
    (config({"bins": [{"name": "only", "max_size": 10, "max_batch": 2, "max_wait_ms": 5,
                       "max_depth": 2}]}), "changes bins of model 'tiny'"),
    (config({"max_input_bytes": 10}), "changes max_input_bytes"),
    ({"parameters": {"file:1/model.pt": "AAAA"}}, "no model files"),
    ({"parameters": 5}, "parameters must be a JSON object"),
    (b"{", "request body is not valid JSON"),
])
def test_a_bad_load_answers_400_naming_the_problem_and_changes_nothing(
        http: FlaskClient, repo: Repository, body: Any, says: str) -> None:
    before = repo.read(["tiny"])
    sent = http.post(LOAD.format("tiny"), data=body) if isinstance(body, bytes) else \
        http.post(LOAD.format("tiny"), json=body)
    assert sent.status_code == 400, sent.get_json()
    assert says in sent.get_json()["error"]
    assert repo.read(["tiny"]) == before


@pytest.mark.parametrize("path", ["/v2/repository/index", LOAD.format("tiny"),
                                  UNLOAD.format("tiny")])
@pytest.mark.parametrize(("body", "says"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to parse"),
    (b'{"ready": NaN}', "NaN is not valid JSON"),
])
def test_a_body_nested_too_deeply_or_holding_nan_answers_400_and_changes_nothing(
        http: FlaskClient, repo: Repository, path: str, body: bytes, says: str) -> None:
    before = repo.read(["tiny"])
    sent = http.post(path, data=body, content_type="application/json")
    assert sent.status_code == 400, sent.get_json()
    assert says in sent.get_json()["error"]
    assert repo.read(["tiny"]) == before


def test_an_override_of_an_option_the_web_reads_is_refused(
        http: FlaskClient, repo: Repository) -> None:
    sent = http.post(LOAD.format("imgs"), json=config({"options": {"max_pixels": 10}}))
    assert sent.status_code == 400 and "its input limits" in sent.get_json()["error"]
    assert repo.read(["imgs"])["imgs"] == Desired()


@pytest.mark.parametrize(("model", "option"), [
    ("texts", "max_chars"), ("texts", "max_tokens"), ("imgs", "max_side"), ("imgs", "top_k")])
def test_an_option_the_web_reads_given_a_wrong_type_answers_400_naming_it(
        http: FlaskClient, repo: Repository, model: str, option: str) -> None:
    sent = http.post(LOAD.format(model),
                     json={"parameters": {"config": {"options": {option: "x"}}}})
    assert sent.status_code == 400, sent.get_json()
    assert f"options.{option} must be an integer, not 'x'" in sent.get_json()["error"]
    assert repo.read([model])[model] == Desired()


def test_an_unknown_model_answers_404(http: FlaskClient) -> None:
    assert http.post(LOAD.format("nope"), json={}).status_code == 404
    assert http.post(UNLOAD.format("nope"), json={}).status_code == 404


def test_with_keys_on_only_an_admin_key_changes_models(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis,
        repo: Repository) -> None:
    settings = web_settings(redis_url, key_prefix, tmp_path,
                            CARPOOL_API_KEYS=f"{ADMIN} admin,{USER}")
    with web_client(settings) as http:
        assert http.post(UNLOAD.format("tiny")).status_code == 401
        user = {"Authorization": f"Bearer {USER}"}
        forbidden = http.post(UNLOAD.format("tiny"), headers=user)
        assert forbidden.status_code == 403 and "admin key" in forbidden.get_json()["error"]
        assert http.post("/v2/repository/index", headers=user).status_code == 200
        assert repo.read(["tiny"])["tiny"] == Desired()
        admin = http.post(UNLOAD.format("tiny"), headers={"Authorization": f"Bearer {ADMIN}"})
        assert admin.status_code == 200 and not repo.read(["tiny"])["tiny"].loaded


@pytest.fixture
def versioned(redis_url: str, key_prefix: str, tmp_path: Path,
              client: redis.Redis) -> Iterator[FlaskClient]:
    catalogue = tmp_path / "versions.toml"
    catalogue.write_text(CATALOGUE_TOML + TINY_2)
    with web_client(load_settings(make_env(redis_url, key_prefix,
                                           CARPOOL_CONFIG=str(catalogue)))) as c:
        yield c


def rows(http: FlaskClient, model: str) -> dict[str, dict[str, Any]]:
    index = http.post("/v2/repository/index", data=b"").get_json()
    return {e["version"]: e for e in index if e["name"] == model}


def test_each_version_is_an_index_row_and_unloading_one_leaves_the_other_served(
        versioned: FlaskClient, client: redis.Redis, keys: Keys, repo: Repository) -> None:
    Registry(client, keys).publish("w1", ["tiny", "tiny@2"], {},
                                   generations={"tiny": 0, "tiny@2": 0})
    assert rows(versioned, "tiny") == {v: {"name": "tiny", "version": v, "state": "READY"}
                                       for v in ("1", "2")}
    assert versioned.get("/v2/models/tiny/versions/2/ready").status_code == 200
    answer = versioned.post(UNLOAD.format(TINY_2_URL), data=b"").get_json()
    assert (answer["name"], answer["versions"]) == ("tiny", ["2"])
    assert not repo.read(["tiny@2"])["tiny@2"].loaded and repo.read(["tiny"])["tiny"].loaded
    # w1 still serves tiny@2 until it acts on the unload: its claimed jobs finish.
    assert rows(versioned, "tiny")["2"]["state"] == "UNLOADING"
    assert rows(versioned, "tiny")["1"]["state"] == "READY"
    for path in ("tiny/ready", "tiny/versions/1/ready", "tiny@1/ready"):
        assert versioned.get(f"/v2/models/{path}").status_code == 200, path
    for path in ("tiny/versions/2/ready", "tiny@2/ready"):
        unready = versioned.get(f"/v2/models/{path}")
        assert unready.status_code == 400 and "'tiny@2' is not ready: UNLOADING" in \
            unready.get_json()["error"], path
    assert submit(versioned, "tiny@2").status_code == 503
    assert submit(versioned, "tiny").status_code == 202


def test_the_plain_name_loads_and_unloads_every_version_and_m_at_v_one(
        versioned: FlaskClient, client: redis.Redis, keys: Keys, repo: Repository) -> None:
    both = ["tiny", "tiny@2"]
    unloaded = versioned.post(UNLOAD.format("tiny"), data=b"").get_json()
    assert unloaded["versions"] == ["1", "2"] and unloaded["state"] == "UNAVAILABLE"
    assert not any(d.loaded for d in repo.read(both).values())
    # A worker that acted on a later generation serves tiny@2 only; none may serve tiny.
    Registry(client, keys).publish("w1", ["tiny@2"], {}, generations={"tiny@2": 99})
    loaded = versioned.post(LOAD.format("tiny"), json={})
    assert loaded.status_code == 200, loaded.get_json()
    assert [(v["version"], v["state"]) for v in loaded.get_json()["versions"]] == [
        ("1", "NO_WORKER"), ("2", "READY")]
    assert all(d.loaded for d in repo.read(both).values())
    # An override is one version's entry: a load of every version with one is refused.
    overridden = config({"options": {"a": 1}})
    refused = versioned.post(LOAD.format("tiny"), json=overridden)
    assert refused.status_code == 400 and "'tiny@2' (URL-encoded 'tiny%402')" in \
        refused.get_json()["error"]
    assert versioned.post(LOAD.format(TINY_2_URL), json=overridden).status_code == 200
    assert (repo.read(["tiny"])["tiny"].config, repo.read(["tiny@2"])["tiny@2"].config) == (
        "", '{"options":{"a":1}}')
    # m@<its own version> is the model's own entry.
    assert versioned.post(UNLOAD.format("tiny@1"), data=b"").get_json()["versions"] == ["1"]
    assert not repo.read(["tiny"])["tiny"].loaded and repo.read(["tiny@2"])["tiny@2"].loaded
    unknown = versioned.post(LOAD.format("tiny@3"), json={})
    assert unknown.status_code == 404 and "its versions: 1, 2" in unknown.get_json()["error"]
