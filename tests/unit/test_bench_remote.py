"""`carpool bench ... --url`: the report describes the target by what its /models says,
else "unknown" — never by the --workers and --cost-ms it would give a stack of its own."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from carpool.bench import remote
from carpool.bench.cli import build_parser
from carpool.bench.subcommands import dispatch


def serve(models: Any) -> Iterator[str]:
    body = json.dumps(models).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 — http.server's name
            self.send_response(200 if self.path == "/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def plain_target() -> Iterator[str]:
    yield from serve({"models": [{"name": "synthetic", "bins": []}]})


@pytest.fixture
def described_target() -> Iterator[str]:
    yield from serve({"models": [{"name": "synthetic", "workers": ["w1", "w2", "w3"],
                                  "cost_ms": [5, 0.5]}]})


def test_a_target_that_does_not_say_is_described_as_unknown(plain_target: str) -> None:
    line = remote.describe(plain_target, "16")
    assert "workers unknown" in line and "cost a, b = unknown" in line


def test_a_target_that_publishes_workers_and_costs_is_described_by_them(
        described_target: str) -> None:
    line = remote.describe(described_target, "16")
    assert "workers 3" in line and "5, 0.5 ms" in line


def test_unreachable_target_is_unknown_not_an_error() -> None:
    assert "workers unknown" in remote.describe("http://127.0.0.1:9", "16")


def test_bench_header_for_a_url_never_shows_the_defaults_it_would_set(
        plain_target: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr("carpool.bench.subcommands.cmd_run",
                        lambda args, out, header: seen.append(header) or 0)
    argv = ["run", "--url", plain_target, "--rate", "1", "--out", str(tmp_path)]
    assert dispatch(build_parser().parse_args(argv), argv) == 0
    assert "workers [1]" not in seen[0] and "20, 1 ms" not in seen[0]
    assert "workers unknown" in seen[0]
