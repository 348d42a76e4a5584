"""The web's own 429 times: its duration histogram, read before and after a step."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from carpool.bench.scrape import (
    DURATION,
    fetch_buckets,
    parse_buckets,
    quantile_bound,
    quantile_estimate,
)
from web.common.metrics import HTTP_BUCKETS_S, HTTP_LABELS


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram(DURATION, "as the web declares it", HTTP_LABELS,
                               buckets=HTTP_BUCKETS_S, registry=registry)


def test_only_the_asked_route_method_and_status_are_read() -> None:
    registry, h = _histogram()
    h.labels("/submit", "POST", "429").observe(0.004)
    h.labels("/submit", "POST", "202").observe(3.0)
    h.labels("/submit/batch", "POST", "429").observe(3.0)
    buckets = parse_buckets(generate_latest(registry).decode(), "/submit", "POST", "429")
    assert buckets[0.0025] == 0 and buckets[0.005] == 1 and buckets[math.inf] == 1


def test_the_p99_bound_counts_only_what_happened_between_scrapes() -> None:
    registry, h = _histogram()
    series = h.labels("/submit", "POST", "429")
    for _ in range(50):  # an earlier step's slow refusals
        series.observe(2.0)
    before = parse_buckets(generate_latest(registry).decode(), "/submit", "POST", "429")
    for _ in range(99):
        series.observe(0.008)
    series.observe(0.04)
    after = parse_buckets(generate_latest(registry).decode(), "/submit", "POST", "429")
    assert quantile_bound(before, after, 0.99) == (0.01, 100)
    series.observe(0.04)  # now 2 of 101 are above 10 ms: the p99 is in the 50 ms bucket
    after = parse_buckets(generate_latest(registry).decode(), "/submit", "POST", "429")
    assert quantile_bound(before, after, 0.99) == (0.05, 101)
    bound, n = quantile_bound(after, after, 0.99)
    assert math.isnan(bound) and n == 0


def test_the_estimate_interpolates_within_the_p99_bucket_as_prometheus_does() -> None:
    registry, h = _histogram()
    series = h.labels("/submit", "POST", "429")
    before = parse_buckets(generate_latest(registry).decode(), "/submit", "POST", "429")
    for _ in range(90):
        series.observe(0.008)  # the 10 ms bucket
    for _ in range(10):
        series.observe(0.02)  # the 25 ms bucket: rank 99 is the 9th of its 10
    after = parse_buckets(generate_latest(registry).decode(), "/submit", "POST", "429")
    assert quantile_estimate(before, after, 0.99) == pytest.approx(0.01 + 0.015 * 9 / 10)
    for _ in range(5):
        series.observe(120.0)  # past the last finite bound: the estimate stops there
    after = parse_buckets(generate_latest(registry).decode(), "/submit", "POST", "429")
    assert quantile_estimate(before, after, 0.99) == 60.0
    assert math.isnan(quantile_estimate(after, after, 0.99))


@pytest.fixture
def metrics_server() -> Iterator[str]:
    registry, h = _histogram()
    h.labels("/submit", "POST", "429").observe(0.02)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = generate_latest(registry) if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_reads_a_metrics_endpoint_and_gives_none_when_it_cannot(
        metrics_server: str) -> None:
    buckets = fetch_buckets(metrics_server + "/")
    assert buckets is not None and buckets[0.01] == 0 and buckets[0.025] == 1
    assert fetch_buckets("http://127.0.0.1:9/") is None  # nothing listens on discard
