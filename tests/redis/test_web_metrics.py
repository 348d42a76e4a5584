"""GET /metrics of one web process: submissions and rejections counted once per job,
bin depth and oldest age read from Redis at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from carpool.backend import records
from carpool.backend.keys import Keys
from carpool.core.errors import BackendUnavailable
from tests.support.procs import free_port
from tests.support.promtext import Scrape
from tests.support.webtools import MAX_BODY_BYTES, app_state, png, web_client, web_settings


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def scrape(http: FlaskClient) -> Scrape:
    resp = http.get("/metrics")
    assert resp.status_code == 200
    assert resp.content_type.startswith("text/plain")
    return Scrape(resp.get_data(as_text=True))


def submit(http: FlaskClient, model: str = "synthetic", size: Any = 3, **extra: Any) -> int:
    body = {"model": model, "input": {"value": "v", "size": size}, **extra}
    return http.post("/submit", json=body).status_code


def test_accepted_jobs_count_by_bin_and_a_repeated_idempotency_key_counts_once(
        http: FlaskClient) -> None:
    assert [submit(http, size=n) for n in (1, 2, 100)] == [202, 202, 202]
    assert submit(http, idempotency_key="k") == 202
    assert submit(http, idempotency_key="k") == 202  # the first job's id again
    s = scrape(http)
    assert s.value("carpool_jobs_submitted_total", model="synthetic", bin="small") == 3
    assert s.value("carpool_jobs_submitted_total", model="synthetic", bin="medium") == 1
    assert s.value("carpool_jobs_rejected_total") == 0


def test_each_refused_job_counts_once_under_its_reason(http: FlaskClient) -> None:
    assert submit(http, size="big") == 400
    assert submit(http, size=10**6) == 413
    assert submit(http, model="nope") == 404
    assert [submit(http, model="tiny", size=1) for _ in range(3)] == [202, 202, 429]
    assert http.post("/submit", data=b"{", content_type="application/json").status_code == 400
    too_big = b"x" * (MAX_BODY_BYTES + 1)
    assert http.post("/submit?model=imgs", data=too_big,
                     content_type="image/png").status_code == 413
    assert http.post("/submit?model=imgs", data=png(8, 8)[:30],
                     content_type="image/png").status_code == 400
    s = scrape(http)
    rejected = {(ls["model"], ls["reason"]): v for n, ls, v in s.samples
                if n == "carpool_jobs_rejected_total" and v}
    assert rejected == {("synthetic", "invalid"): 1, ("synthetic", "too_large"): 1,
                        ("", "unknown_model"): 1, ("tiny", "bin_full"): 1, ("", "invalid"): 1,
                        ("", "too_large"): 1, ("imgs", "invalid"): 1}
    assert s.value("carpool_jobs_submitted_total", model="tiny") == 2


def test_a_batch_counts_each_input_as_submitted_or_rejected(http: FlaskClient) -> None:
    inputs = [{"value": 1, "size": 1}, {"value": 2, "size": "x"}, {"value": 3, "size": 300}]
    resp = http.post("/submit/batch", json={"model": "synthetic", "inputs": inputs})
    assert resp.status_code == 202
    s = scrape(http)
    assert s.value("carpool_jobs_submitted_total", model="synthetic") == 2
    assert s.value("carpool_jobs_rejected_total", model="synthetic", reason="invalid") == 1


def test_bin_depth_and_oldest_age_come_from_redis_at_scrape_time(
        http: FlaskClient, redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    assert [submit(http, model="tiny", size=1) for _ in range(2)] == [202, 202]
    s = scrape(http)
    assert s.value("carpool_bin_depth", model="tiny", bin="only") == 2
    assert s.value("carpool_bin_depth", model="synthetic", bin="small") == 0
    assert s.value("carpool_bin_oldest_age_seconds", model="synthetic", bin="small") == 0
    assert s.series("carpool_bin_oldest_age_seconds").count({"model": "tiny", "bin": "only"}) == 1
    # Another process sees the same queue: the gauges are Redis's, not this process's.
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as other:
        assert scrape(other).value("carpool_bin_depth", model="tiny", bin="only") == 2
        assert scrape(other).value("carpool_jobs_submitted_total", model="tiny") == 0


def test_the_oldest_age_is_the_oldest_jobs_even_when_a_younger_one_sorts_first(
        http: FlaskClient, client: redis.Redis, key_prefix: str) -> None:
    body = {"model": "synthetic", "input": {"value": "v", "size": 1}}
    old = http.post("/submit", json=body).get_json()["id"]
    assert submit(http, size=1, priority=9) == 202  # the bin's head now
    record = Keys(key_prefix).job(old)
    t_admit = int((records.read(client, record) or {})["t_admit"])
    records.update(client, record, t_admit=t_admit - 60_000)  # admitted a minute ago
    age = scrape(http).value("carpool_bin_oldest_age_seconds", model="synthetic", bin="small")
    assert 60 <= age < 120


def test_without_redis_a_scrape_still_answers_with_counters_and_no_bin_gauges(
        key_prefix: str, tmp_path: Path) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with web_client(web_settings(closed, key_prefix, tmp_path)) as http:
        assert submit(http) == 503
        s = scrape(http)
    assert s.value("carpool_jobs_rejected_total", model="synthetic", reason="unavailable") == 1
    assert "carpool_bin_depth" not in s.families


def test_a_refused_json_body_is_parsed_once_and_still_labelled_by_its_model(
        http: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import carpool.intake.inputs

    parses = []
    real_loads = carpool.intake.inputs.json.loads

    def counting_loads(*args: Any, **kwargs: Any) -> Any:
        parses.append(1)
        return real_loads(*args, **kwargs)

    monkeypatch.setattr(carpool.intake.inputs.json, "loads", counting_loads)
    assert submit(http, size=-1) == 400
    monkeypatch.undo()
    assert len(parses) == 1
    assert scrape(http).value("carpool_jobs_rejected_total", model="synthetic",
                              reason="invalid") == 1


def test_a_submission_refused_for_its_api_key_is_not_a_rejected_job(
        redis_url: str, key_prefix: str, tmp_path: Path, client: redis.Redis) -> None:
    key = "alice-key-0123456789abcdef01"
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_API_KEYS=key)
    with web_client(settings) as http:
        body = {"model": "synthetic", "input": {"value": "v", "size": 3}}
        assert http.post("/submit", json=body).status_code == 401
        assert http.post("/submit", json={**body, "input": {"value": "v", "size": "big"}},
                         headers={"Authorization": f"Bearer {key}"}).status_code == 400
        s = scrape(http)
    assert s.value("carpool_jobs_rejected_total") == 1  # the bad input, not the bad key
    assert s.value("carpool_jobs_rejected_total", model="synthetic", reason="invalid") == 1


class Probe:
    """A collector that counts its scrapes."""

    def __init__(self) -> None:
        self.collected = 0

    def collect(self) -> Iterator[Any]:
        self.collected += 1
        yield from ()


def test_the_gauges_read_from_redis_wait_on_one_ping_not_one_timeout_each(
        http: FlaskClient) -> None:
    """A Redis that does not answer costs a scrape one socket timeout (the ping's): one
    per collector outlasted Prometheus's scrape timeout."""
    metrics = app_state(http).metrics
    kinds = {type(c).__name__ for c in metrics.from_redis.collectors}
    assert kinds == {"BinGauges", "NeedGauges", "ShadowCounters"}
    probe = Probe()
    metrics.from_redis.collectors.append(probe)
    scrape(http)
    assert probe.collected == 1

    def unavailable() -> None:
        raise BackendUnavailable("Redis timed out")

    pinged, metrics.from_redis._ping = metrics.from_redis._ping, unavailable
    try:
        s = scrape(http)
    finally:
        metrics.from_redis._ping = pinged
    assert probe.collected == 1  # not asked: the ping said Redis is away
    assert "carpool_bin_depth" not in s.families and "carpool_http_requests_total" in s.families
