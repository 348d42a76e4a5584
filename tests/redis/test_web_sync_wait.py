"""The synchronous endpoints' one way through (web/common/sync_wait.py) on a real Redis:
``/v1/embeddings`` counted and slotted like the others, all of its jobs or none, and the
caller's ``X-Carpool-Timeout`` as its jobs' deadline. Hang-ups need a real socket:
tests/e2e/test_e2e_hangups.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend import records
from carpool.backend.keys import Keys
from tests.support.promtext import Scrape
from tests.support.webtools import app_state, web_client, web_settings

TIMEOUT = "X-Carpool-Timeout"


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_MAX_WAIT_S="1",
                            CARPOOL_MAX_POLLS_PER_CLIENT="1")
    with web_client(settings) as c:
        yield c


def scrape(http: FlaskClient) -> Scrape:
    return Scrape(http.get("/metrics").get_data(as_text=True))


def depth(http: FlaskClient, model: str, bin_name: str) -> int:
    return int(app_state(http).queue.depths([(model, bin_name)])[0])


def test_embeddings_count_their_jobs_as_submitted(http: FlaskClient) -> None:
    resp = http.post("/v1/embeddings", json={"model": "texts", "input": ["a", "b", "c"]})
    assert resp.status_code == 504  # no worker here: queued, then the wait ran out
    s = scrape(http)
    assert s.value("carpool_jobs_submitted_total", model="texts", bin="short") == 3
    assert s.value("carpool_web_long_polls") == 0  # its slot was given back


def test_embeddings_are_all_queued_or_none_and_counted_rejected(http: FlaskClient) -> None:
    # The short bin holds 100: the 101st string is refused, so the 100 before it go too.
    resp = http.post("/v1/embeddings", json={"model": "texts", "input": ["a"] * 101})
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "bin_full"
    assert depth(http, "texts", "short") == 0
    s = scrape(http)
    assert s.value("carpool_jobs_rejected_total", model="texts", reason="bin_full") == 101
    assert s.value("carpool_jobs_submitted_total", model="texts", bin="short") == 0


def test_embeddings_take_a_long_poll_slot(http: FlaskClient) -> None:
    with app_state(http).polls.hold("127.0.0.1"):  # this client's one slot (the cap is 1)
        resp = http.post("/v1/embeddings", json={"model": "texts", "input": "a"})
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "too_many_polls"
    assert resp.headers["Retry-After"] == "1"
    assert depth(http, "texts", "short") == 0  # refused before anything was queued


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf", "1e9"])
@pytest.mark.parametrize(("path", "body"), [
    ("/submit", {"model": "tiny", "input": {"value": 1, "size": 1}}),
    ("/v2/models/tiny/infer", {"inputs": [{"name": "VALUE", "datatype": "FP32",
                                           "shape": [1, 1], "data": [1.0]}]}),
    ("/v1/embeddings", {"model": "texts", "input": "a"}),
])
def test_a_malformed_timeout_is_a_400_naming_the_header(
        http: FlaskClient, path: str, body: dict[str, object], value: str) -> None:
    resp = http.post(path, json=body, headers={TIMEOUT: value})
    assert resp.status_code == 400, resp.get_data(as_text=True)
    assert TIMEOUT in resp.get_data(as_text=True)
    assert depth(http, "tiny", "only") == 0 and depth(http, "texts", "short") == 0


@pytest.mark.parametrize(("timeout", "deadline_ms", "expected_ms"), [
    ("2.5", None, 2500),      # the caller's timeout is the deadline
    ("5", 1000, 1000),        # the sooner of the two
    ("1", 3000, 1000),
    ("86400", None, 60000),   # at most the model's max_deadline_ms
])
def test_the_callers_timeout_becomes_the_jobs_deadline(
        http: FlaskClient, client: redis.Redis, keys: Keys, timeout: str,
        deadline_ms: int | None, expected_ms: int) -> None:
    body: dict[str, object] = {"model": "tiny", "input": {"value": 1, "size": 1}}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    resp = http.post("/submit", json=body, headers={TIMEOUT: timeout})
    assert resp.status_code == 202, resp.get_json()
    record = records.read(client, keys.job(resp.get_json()["id"])) or {}
    assert int(record["deadline"]) - int(record["t_admit"]) == expected_ms


def test_without_a_timeout_the_models_default_deadline_holds(
        http: FlaskClient, client: redis.Redis, keys: Keys) -> None:
    resp = http.post("/submit", json={"model": "tiny", "input": {"value": 1, "size": 1}})
    record = records.read(client, keys.job(resp.get_json()["id"])) or {}
    assert int(record["deadline"]) - int(record["t_admit"]) == 4000  # tiny's default


def test_the_wait_is_cut_to_the_callers_timeout(http: FlaskClient) -> None:
    resp = http.post("/submit", json={"model": "tiny", "input": {"value": 1, "size": 1}},
                     headers={TIMEOUT: "0.1", "Prefer": "wait=1"})
    assert resp.status_code == 202 and resp.headers["Preference-Applied"] == "wait=0"


def test_redis_lost_names_the_jobs_that_may_be_queued_by_call(
        key_prefix: str, tmp_path: Path) -> None:
    from tests.support.procs import free_port

    closed = f"redis://127.0.0.1:{free_port()}/0"
    job = {"value": 1, "size": 1}
    with web_client(web_settings(closed, key_prefix, tmp_path)) as http:
        one = http.post("/submit", json={"model": "synthetic", "input": job})
        batch = http.post("/submit/batch", json={"model": "synthetic", "inputs": [job]})
    assert one.status_code == batch.status_code == 503
    assert isinstance(one.get_json()["id"], str)  # a submit's one job
    assert len(batch.get_json()["ids"]) == 1  # a batch's, even of one
