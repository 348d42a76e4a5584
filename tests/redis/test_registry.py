"""The model registry: workers' heartbeats in a real Redis, the rule the web applies,
and the web's cache (a fake clock: the cache is a pure unit around the registry)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from carpool.backend.keys import Keys
from carpool.backend.registry import Registry, RegistryCache, WorkerModels, availability
from carpool.core.errors import ModelRefused
from tests.support.procs import wait_until
from tests.support.webtools import jpeg, web_client, web_settings

NO_WEIGHTS = "model 'imgs' has no weights: set [models.imgs.options] weights = ..."


@pytest.fixture
def registry(client: redis.Redis, keys: Keys) -> Registry:
    return Registry(client, keys)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_an_entry_lives_until_its_heartbeat_lapses_and_a_withdrawn_one_at_once(
        registry: Registry) -> None:
    registry.publish("w1", ["synthetic"], {"imgs": NO_WEIGHTS}, ttl_ms=300)
    registry.publish("w2", ["synthetic", "imgs"], {})
    assert sorted(w.worker for w in registry.live()) == ["w1", "w2"]
    assert registry.live()[0] in (WorkerModels("w1", ("synthetic",), {"imgs": NO_WEIGHTS}),
                                  WorkerModels("w2", ("synthetic", "imgs"), {}))
    wait_until(lambda: [w.worker for w in registry.live()] == ["w2"], 10, "w1 to lapse")
    registry.withdraw("w2")
    assert registry.live() == []


def test_refused_means_no_live_worker_serves_it_and_one_refused_it() -> None:
    refuser = WorkerModels("w1", ("synthetic",), {"imgs": NO_WEIGHTS})
    server = WorkerModels("w2", ("imgs",), {})
    assert availability([refuser], "imgs").state == "refused"
    assert availability([refuser, server], "imgs").state == "served"
    assert availability([], "imgs").state == "no worker"  # scale from zero: queue it
    assert availability([refuser], "texts").state == "no worker"


def test_refused_means_none_still_loads_it_and_while_one_does_it_is_loading() -> None:
    refuser = WorkerModels("w1", ("synthetic",), {"imgs": NO_WEIGHTS})
    loader = WorkerModels("w2", (), {}, ("imgs", "texts"))
    other = WorkerModels("w3", (), {}, ("texts",))
    assert availability([refuser, loader], "imgs").state == "loading"  # the grace applies
    assert availability([refuser, other], "imgs").state == "refused"  # loads another model
    assert availability([loader], "imgs").state == "loading"
    assert availability([loader, WorkerModels("w4", ("imgs",), {})], "imgs").state == "served"
    assert availability([refuser, loader], "imgs").to_json() == {
        "state": "loading", "served_by": 0, "loading_by": 1,
        "refused": [{"worker": "w1", "reason": NO_WEIGHTS}]}


def test_an_entry_says_what_its_worker_is_still_loading(registry: Registry) -> None:
    registry.publish("w1", [], {"imgs": NO_WEIGHTS}, loading=["texts"])
    assert registry.live() == [WorkerModels("w1", (), {"imgs": NO_WEIGHTS}, ("texts",))]


def test_the_cache_rereads_the_registry_at_most_every_refresh(registry: Registry) -> None:
    clock = FakeClock()
    cache = RegistryCache(registry, refresh_s=2.0, clock=clock)
    registry.publish("w1", ["imgs"], {})
    cache.check("imgs")
    registry.publish("w1", [], {"imgs": NO_WEIGHTS})
    clock.now_s += 1.0
    cache.check("imgs")  # still the view of a second ago: no Redis round trip
    clock.now_s += 1.5
    with pytest.raises(ModelRefused, match="has no weights"):
        cache.check("imgs")


def test_submit_answers_503_for_a_refused_model_and_202_when_no_worker_is_live(
        redis_url: str, key_prefix: str, tmp_path: Path, registry: Registry) -> None:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as http:
        def post() -> int:
            r = http.post("/submit?model=imgs", data=jpeg(64, 48),
                          headers={"Content-Type": "image/jpeg"})
            return r.status_code

        assert post() == 202  # no live worker at all
        registry.publish("w1", ["synthetic"], {"imgs": NO_WEIGHTS})
        wait_until(lambda: post() == 503, 10, "the web's cache to see the refusal")
        body = http.get("/models").get_json()
        imgs = next(m for m in body["models"] if m["name"] == "imgs")
        assert imgs["workers"] == {"state": "refused", "served_by": 0, "loading_by": 0,
                                   "refused": [{"worker": "w1", "reason": NO_WEIGHTS}]}
        r = http.post("/submit?model=imgs", data=jpeg(64, 48),
                      headers={"Content-Type": "image/jpeg"})
        assert r.get_json()["error"] == {
            "code": "model_unavailable",
            "message": f"no live worker serves model 'imgs': worker w1 refused it: {NO_WEIGHTS}",
            "type": "server_error", "param": None}
        registry.withdraw("w1")
        wait_until(lambda: post() == 202, 10, "the web's cache to see no live worker")


#: One request per admission surface, each for a model of the test catalogue.
SURFACES = {
    "/submit": ("/submit", {"model": "synthetic", "input": {"value": 1, "size": 1}}),
    "/submit/batch": ("/submit/batch", {"model": "synthetic",
                                        "inputs": [{"value": 1, "size": 1}]}),
    "/v2 infer": ("/v2/models/synthetic/infer", {"inputs": [
        {"name": "VALUE", "datatype": "FP32", "shape": [1, 2], "data": [[1.0, 2.0]]}]}),
    "/v1/embeddings": ("/v1/embeddings", {"model": "texts", "input": "a"}),
}


def test_every_surface_admits_while_a_worker_still_loads_the_model_and_refuses_once_none_does(
        redis_url: str, key_prefix: str, tmp_path: Path, registry: Registry) -> None:
    refused = {"synthetic": NO_WEIGHTS, "texts": NO_WEIGHTS}
    registry.publish("w1", [], refused)
    registry.publish("w2", [], {}, loading=["synthetic", "texts"])
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as http:
        wait_until(lambda: http.get("/models").get_json()["models"][0]["workers"]["state"]
                   == "loading", 10, "the web's cache to see the loading worker")
        for name in ("/submit", "/submit/batch"):  # the others wait for the result
            path, body = SURFACES[name]
            assert http.post(path, json=body).status_code == 202, name
        registry.publish("w2", [], refused)  # it refused them too: nobody will run them
        path, body = SURFACES["/submit"]
        wait_until(lambda: http.post(path, json=body).status_code == 503, 10,
                   "the web's cache to see the refusal")
        for name, (path, body) in SURFACES.items():
            r = http.post(path, json=body)
            assert r.status_code == 503, (name, r.get_json())
            text = r.get_data(as_text=True)
            assert NO_WEIGHTS in text and "worker w1 refused it" in text, name
            # KServe's error is {"error": message}: its code is the 503 alone.
            assert name == "/v2 infer" or "model_unavailable" in text, name
