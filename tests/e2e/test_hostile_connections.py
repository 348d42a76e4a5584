"""Hostile load on connections and bodies: real gunicorn (gevent), a private Redis.

Slow bodies are let go, dropped long-polls end, one client's polls are capped,
and bodies over their limit are refused before (or while) they are read, a PUT's
(a rollout change) as a POST's.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import make_env
from tests.support.procs import answers, start_web, wait_until
from tests.support.redisproc import RedisProc, private_redis
from tests.support.webtools import CATALOGUE_TOML

#: Slots of the one gevent worker under test: fewer than the slow sockets it gets.
WORKER_CONNECTIONS = 40
SLOW_SOCKETS = 60
#: The body time limit under test (seconds); the default is 10.
BODY_TIMEOUT_S = 1
#: Bound on waiting for what the server must do by itself (close, answer, end polls):
#: well under the 60 s of wait the polls ask for.
SERVER_ACTS_S = 20.0
POLL_CAP = 3
DROPPED_POLLS = 30


@pytest.fixture
def server() -> Iterator[RedisProc]:
    with private_redis() as server:
        yield server


@pytest.fixture
def env(server: RedisProc, tmp_path: Path, key_prefix: str) -> dict[str, str]:
    config = tmp_path / "catalogue.toml"
    config.write_text(CATALOGUE_TOML)
    return make_env(server.url, key_prefix, CARPOOL_CONFIG=str(config),
                    CARPOOL_WEB_WORKERS="1", CARPOOL_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
                    CARPOOL_WEB_WORKER_CONNECTIONS=str(WORKER_CONNECTIONS),
                    CARPOOL_MAX_POLLS_PER_CLIENT=str(POLL_CAP))


def connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=SERVER_ACTS_S)


#: An admin's rollout change: a PUT, whose body is read as a POST's is.
ROLLOUT = "PUT /models/tiny/rollout"


def slow_body(base: str, route: str = "POST /submit") -> socket.socket:
    """Headers of a 100-byte JSON ``route`` ("METHOD /path"), and one byte of its body."""
    s = connect(base)
    s.sendall(f"{route} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              "Content-Length: 100\r\n\r\n{".encode())
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (bounded by the socket timeout)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def status_of(raw: bytes) -> int:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    assert match, raw[:200]
    return int(match[1])


def queued_job(base: str) -> str:
    r = requests.post(f"{base}/submit", json={"model": "tiny", "input": {"value": 1, "size": 1}},
                      timeout=10)
    return str(r.json()["id"])


def long_polls(base: str) -> float:
    text = requests.get(f"{base}/metrics", timeout=10).text
    match = re.search(r"^carpool_web_long_polls (\S+)$", text, re.M)
    return float(match[1]) if match else 0.0


@pytest.mark.parametrize("route", ["POST /submit", ROLLOUT])
def test_a_slow_body_is_answered_408_and_its_connection_closed(env: dict[str, str],
                                                               route: str) -> None:
    with start_web(env) as base:
        s = slow_body(base, route)
        raw = read_all(s)  # without a body time limit this never returns
        s.close()
    assert status_of(raw) == 408
    assert b'"body_timeout"' in raw


def test_more_slow_bodies_than_slots_cannot_keep_healthz_out(env: dict[str, str]) -> None:
    with start_web(env) as base:
        socks = [slow_body(base) for _ in range(SLOW_SOCKETS)]
        try:
            wait_until(lambda: answers(f"{base}/healthz"), SERVER_ACTS_S,
                       "/healthz while slow bodies hold every slot")
        finally:
            for s in socks:
                s.close()


def test_dropped_long_polls_end_instead_of_waiting_out_their_wait(env: dict[str, str]) -> None:
    env = {**env, "CARPOOL_MAX_POLLS_PER_CLIENT": str(DROPPED_POLLS)}
    with start_web(env) as base:
        job_id = queued_job(base)
        socks = []
        for _ in range(DROPPED_POLLS):
            s = connect(base)
            s.sendall(f"GET /result/{job_id}?wait=60 HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            socks.append(s)
        wait_until(lambda: long_polls(base) == DROPPED_POLLS, SERVER_ACTS_S, "polls to wait")
        for s in socks:
            s.close()
        wait_until(lambda: long_polls(base) == 0, SERVER_ACTS_S, "dropped polls to end")


def test_a_client_over_its_long_poll_cap_gets_429(env: dict[str, str]) -> None:
    with start_web(env) as base:
        job_id = queued_job(base)
        socks = []
        for _ in range(POLL_CAP):
            s = connect(base)
            s.sendall(f"GET /result/{job_id}?wait=60 HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            socks.append(s)
        try:
            wait_until(lambda: long_polls(base) == POLL_CAP, SERVER_ACTS_S, "polls to wait")
            over = requests.get(f"{base}/result/{job_id}?wait=60", timeout=SERVER_ACTS_S)
            plain = requests.get(f"{base}/result/{job_id}", timeout=SERVER_ACTS_S)
        finally:
            for s in socks:
                s.close()
    assert over.status_code == 429 and over.json()["error"]["code"] == "too_many_polls"
    assert int(over.headers["Retry-After"]) >= 1
    assert plain.status_code == 200  # a poll without wait holds nothing


def test_a_submit_with_wait_over_the_poll_cap_is_admitted_and_answered_at_once(
        env: dict[str, str]) -> None:
    """No worker serves "tiny": without the cap this submit would wait its 60 s."""
    with start_web(env) as base:
        job_id = queued_job(base)
        socks = []
        for _ in range(POLL_CAP):
            s = connect(base)
            s.sendall(f"GET /result/{job_id}?wait=60 HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            socks.append(s)
        try:
            wait_until(lambda: long_polls(base) == POLL_CAP, SERVER_ACTS_S, "polls to wait")
            r = requests.post(f"{base}/submit?wait=60", json={"model": "tiny", "input": {
                "value": 2, "size": 1}}, timeout=SERVER_ACTS_S)
        finally:
            for s in socks:
                s.close()
    assert r.status_code == 202 and r.json()["status"] == "queued"


def test_a_body_over_its_limit_is_refused_from_its_content_length_alone(
        env: dict[str, str]) -> None:
    """12 MB of JSON: over every model's JSON limit (resnet18's 8 MiB as base64: 11.2 MB),
    under CARPOOL_MAX_BODY_BYTES (16 MiB). Only the headers are sent."""
    with start_web(env) as base:
        s = connect(base)
        s.sendall(b"POST /submit HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 12000000\r\n\r\n")
        raw = read_all(s)
        s.close()
    assert status_of(raw) == 413 and b'"body_too_large"' in raw


def test_a_raw_image_is_limited_by_its_own_model(env: dict[str, str]) -> None:
    with start_web(env) as base:
        r = requests.post(f"{base}/submit?model=imgs", data=b"x" * ((1 << 20) + 1),
                          headers={"Content-Type": "image/png"}, timeout=SERVER_ACTS_S)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("route", ["POST /submit", ROLLOUT])
def test_a_chunked_body_over_the_limit_is_413_not_a_truncated_400(env: dict[str, str],
                                                                  route: str) -> None:
    doc = json.dumps({"model": "tiny", "input": {"value": "x" * 12_000_000, "size": 1}})

    def chunks() -> Iterator[bytes]:
        data = doc.encode()
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    method, path = route.split(" ")
    with start_web(env) as base:
        r = requests.request(method, f"{base}{path}", data=chunks(),
                             headers={"Content-Type": "application/json"},
                             timeout=SERVER_ACTS_S)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_a_json_body_of_many_tiny_values_is_refused_before_it_is_built(
        env: dict[str, str]) -> None:
    body = b'{"model": "tiny", "input": {"value": [' + b"{}," * 600_000 + b'{}], "size": 1}}'
    with start_web(env) as base:
        r = requests.post(f"{base}/submit", data=body,
                          headers={"Content-Type": "application/json"}, timeout=SERVER_ACTS_S)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_json_values"
