"""Load shedding in front of the app: the lag arithmetic on a fake clock, X-Request-Start,
which requests may be shed, and the 503 answered before the body, JSON or Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from carpool.core.settings import load_settings
from tests.support.procs import free_port
from tests.support.promtext import Scrape
from tests.support.webtools import app_state, web_client, web_settings
from web.common.shedding import (
    EXTENSION,
    REASON_LAG,
    REASON_REQUEST_START,
    LagMonitor,
    Shedder,
    admits_work,
    request_start_s,
)

SUBMIT = {"model": "synthetic", "input": {"value": "v", "size": 1}}
#: Far past any bound a test sets: a stamp this old is shed whatever the machine's load.
LONG_AGO_S = 3600.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def monitor_on(clock: FakeClock) -> LagMonitor:
    return LagMonitor(interval_s=0.025, half_life_s=0.5, clock=clock)


def test_a_wake_up_on_time_is_no_lag_and_a_late_one_is_its_lateness() -> None:
    clock = FakeClock()
    monitor = monitor_on(clock)
    monitor.woke(slept_at=100.0, now=100.025)
    assert monitor.lag_s(100.025) == pytest.approx(0.0, abs=1e-9)
    monitor.woke(slept_at=100.025, now=100.450)
    assert monitor.lag_s(100.450) == pytest.approx(0.4)


def test_the_peak_halves_every_half_life_and_an_on_time_wake_up_keeps_it() -> None:
    clock = FakeClock()
    monitor = monitor_on(clock)
    monitor.woke(slept_at=100.0, now=100.825)  # 0.8 s late
    monitor.woke(slept_at=100.825, now=101.325 - 0.475)  # on time, 25 ms later
    assert monitor.lag_s(101.325) == pytest.approx(0.4)
    assert monitor.lag_s(101.825) == pytest.approx(0.2)


def test_a_sleep_still_overdue_counts_before_the_monitor_wakes() -> None:
    clock = FakeClock()
    seen: list[float] = []

    def stalled_sleep(interval_s: float) -> None:
        if interval_s == 0:
            return  # the yield behind the ready queue: none waits
        clock.now += interval_s + 2.0  # the loop stops for 2 s past the wake-up
        seen.append(monitor.lag_s())  # a request handled before the monitor runs

    monitor = LagMonitor(interval_s=0.025, half_life_s=0.5, clock=clock, sleep=stalled_sleep)
    monitor.step()
    assert seen == [pytest.approx(2.0)]
    assert monitor.lag_s() == pytest.approx(2.0)  # and the wake-up recorded it


def test_a_wake_up_that_waits_behind_the_ready_queue_is_late_by_that_wait() -> None:
    """The timer fires on time, but the greenlets made ready before it (new connections'
    handlers, woken waiters) run first: a request woken then waits as long."""
    clock = FakeClock()
    sleeps: list[float] = []

    def busy_queue(interval_s: float) -> None:
        sleeps.append(interval_s)
        clock.now += interval_s if interval_s else 0.3  # the yield waits 300 ms

    monitor = LagMonitor(interval_s=0.025, half_life_s=0.5, clock=clock, sleep=busy_queue)
    monitor.step()
    assert sleeps == [0.025, 0]
    assert monitor.lag_s() == pytest.approx(0.3)


def test_steps_on_time_leave_no_lag() -> None:
    clock = FakeClock()

    def on_time(interval_s: float) -> None:
        clock.now += interval_s

    monitor = LagMonitor(interval_s=0.025, clock=clock, sleep=on_time)
    for _ in range(10):
        monitor.step()
    assert monitor.lag_s() == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(("header", "expected"), [
    ("t=1764660000.123", 1764660000.123),  # nginx: t=${msec}
    ("1764660000123", 1764660000.123),  # Heroku: milliseconds
    ("t=1764660000123456", 1764660000.123456),  # microseconds
    (" t=1764660000 ", 1764660000.0),
    ("", None), (None, None), ("t=", None), ("soon", None), ("t=-5", None),
    ("t=inf", None), ("nan", None),
])
def test_x_request_start_is_read_in_seconds_milliseconds_or_microseconds(
        header: str | None, expected: float | None) -> None:
    got = request_start_s(header)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(("method", "path", "shed"), [
    ("POST", "/submit", True), ("POST", "/submit/batch", True),
    ("POST", "/v2/models/synthetic/infer", True), ("POST", "/v1/models/m:predict", True),
    ("GET", "/result/abc", False), ("DELETE", "/result/abc", False),
    ("GET", "/healthz", False), ("GET", "/readyz", False), ("GET", "/metrics", False),
    ("GET", "/submit", False), ("POST", "/submitted", False),
])
def test_only_requests_that_admit_work_may_be_shed(method: str, path: str, shed: bool) -> None:
    assert admits_work(method, path) is shed


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_WEB_MAX_QUEUE_MS="300")
    with web_client(settings) as c:
        yield c


def shed_count(http: FlaskClient, reason: str) -> float:
    return Scrape(http.get("/metrics").get_data(as_text=True)).value(
        "carpool_web_shed_total", reason=reason)


def stamp(age_s: float) -> dict[str, str]:
    return {"X-Request-Start": f"t={time.time() - age_s:.6f}"}


def assert_shed(resp: TestResponse) -> None:
    assert resp.status_code == 503
    assert resp.headers["Retry-After"] == "1"
    assert resp.headers["Content-Type"] == "application/json"
    body = resp.json
    assert body is not None and body["error"]["code"] == "overloaded"
    assert "300 ms" in body["error"]["message"]


def test_a_submit_that_started_too_long_ago_is_shed_and_counted(http: FlaskClient) -> None:
    assert shed_count(http, REASON_REQUEST_START) == 0
    assert_shed(http.post("/submit", json=SUBMIT, headers=stamp(LONG_AGO_S)))
    assert_shed(http.post("/submit/batch", json={"model": "synthetic", "inputs": []},
                          headers=stamp(LONG_AGO_S)))
    assert shed_count(http, REASON_REQUEST_START) == 2
    assert http.post("/submit", json=SUBMIT, headers=stamp(0.0)).status_code == 202
    assert http.post("/submit", json=SUBMIT).status_code == 202
    assert shed_count(http, REASON_REQUEST_START) == 2


def test_reads_deletes_and_probes_are_never_shed(http: FlaskClient) -> None:
    app_state(http)  # the app is built
    old = stamp(LONG_AGO_S)
    assert http.get("/healthz", headers=old).status_code == 200
    assert http.get("/readyz", headers=old).status_code == 200
    assert http.get("/metrics", headers=old).status_code == 200
    assert http.get("/result/nope", headers=old).status_code == 404
    assert http.delete("/result/nope", headers=old).status_code == 404


def test_a_lagging_event_loop_sheds_submits_until_the_lag_decays(http: FlaskClient) -> None:
    shedder = http.application.extensions[EXTENSION]
    assert isinstance(shedder, Shedder)
    now = time.monotonic()
    shedder.monitor.woke(slept_at=now - LONG_AGO_S, now=now)
    assert_shed(http.post("/submit", json=SUBMIT))
    assert shed_count(http, REASON_LAG) == 1
    assert http.get("/healthz").status_code == 200
    shedder.monitor.woke(slept_at=now - LONG_AGO_S, now=now - LONG_AGO_S)  # long decayed
    assert http.post("/submit", json=SUBMIT).status_code == 202


def test_a_shed_reads_no_body_and_asks_no_redis(tmp_path: Path, key_prefix: str) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    settings = web_settings(nowhere, key_prefix, tmp_path, CARPOOL_WEB_MAX_QUEUE_MS="300")
    with web_client(settings) as http:
        garbage = http.post("/submit", data=b"{not json", content_type="application/json",
                            headers=stamp(LONG_AGO_S))
        assert_shed(garbage)  # not 400 invalid_json, not 503 backend_unavailable
        assert http.post("/submit", json=SUBMIT).json["error"]["code"] == "backend_unavailable"


def test_a_bound_of_zero_never_sheds(redis_url: str, key_prefix: str, tmp_path: Path,
                                     client: redis.Redis) -> None:
    settings = web_settings(redis_url, key_prefix, tmp_path, CARPOOL_WEB_MAX_QUEUE_MS="0")
    with web_client(settings) as http:
        assert http.post("/submit", json=SUBMIT, headers=stamp(LONG_AGO_S)).status_code == 202


def test_the_bound_is_a_setting_of_a_few_hundred_ms_by_default() -> None:
    assert load_settings({}).web_max_queue_ms == 300
    assert load_settings({"CARPOOL_WEB_MAX_QUEUE_MS": "0"}).web_max_queue_ms == 0


def refusal_count(http: FlaskClient) -> float:
    return Scrape(http.get("/metrics").get_data(as_text=True)).value(
        "carpool_web_refusal_seconds_count")


def test_refusals_of_admitting_requests_are_timed_in_metrics(http: FlaskClient) -> None:
    assert refusal_count(http) == 0
    assert_shed(http.post("/submit", json=SUBMIT, headers=stamp(LONG_AGO_S)))
    assert http.post("/submit", json=SUBMIT).status_code == 202
    assert http.post("/submit", json={"model": "nope", "input": {}}).status_code in (400, 404)
    assert http.get("/result/nope").status_code == 404
    assert refusal_count(http) == 1
