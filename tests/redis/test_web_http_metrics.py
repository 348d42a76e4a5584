"""The web's own HTTP metrics: every request counted and timed by route pattern,
method and status — ids never become label values."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from tests.support.promtext import Scrape
from tests.support.webtools import web_client, web_settings


@pytest.fixture
def http(redis_url: str, key_prefix: str, tmp_path: Path,
         client: redis.Redis) -> Iterator[FlaskClient]:
    with web_client(web_settings(redis_url, key_prefix, tmp_path)) as c:
        yield c


def test_requests_are_counted_and_timed_by_route_method_and_status(http: FlaskClient) -> None:
    job = {"model": "synthetic", "input": {"value": 1, "size": 2}}
    ids = [http.post("/submit", json=job).get_json()["id"] for _ in range(2)]
    assert http.post("/submit", json={"model": "nope", "input": {}}).status_code == 404
    for job_id in ids:
        assert http.get(f"/result/{job_id}").status_code == 200
    assert http.get("/no/such/path").status_code == 404
    assert http.open("/submit", method="BREW").status_code == 405
    text = http.get("/metrics").get_data(as_text=True)
    s = Scrape(text)
    count = "carpool_http_requests_total"
    assert s.value(count, route="/submit", method="POST", status="202") == 2
    assert s.value(count, route="/submit", method="POST", status="404") == 1
    assert s.value(count, route="/result/<job_id>", method="GET", status="200") == 2
    assert s.value(count, route="unmatched", status="404") == 1
    assert s.value(count, method="other", status="405") == 1  # a made-up method
    assert s.value("carpool_http_request_duration_seconds_count", route="/submit",
                   method="POST", status="202") == 2
    assert s.value("carpool_http_request_duration_seconds_sum", route="/submit") > 0
    assert not any(job_id in text for job_id in ids)  # the pattern, never the id
