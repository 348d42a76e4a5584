"""Malformed chunked bodies through real gunicorn: every route that takes a body (POST,
PUT) answers 400 (or 408 for a body the client stopped sending), never 500; nothing is
admitted or stored, and the web keeps serving. Every route and method with a body reads
it before the route runs.

The requests are written byte by byte on raw sockets: an HTTP client library would
not send a bad chunk size. Each asks ``Connection: close``, so the answer is all the
server sends before it closes.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.core.settings import load_settings
from tests.conftest import make_env
from tests.support.procs import start_web
from tests.support.redisproc import RedisProc, private_redis
from tests.support.webtools import web_client

#: Bound on one exchange: the server answers a malformed body at once.
ANSWER_S = 20.0
#: The multipart boundary of the /v1/files requests.
BOUNDARY = "b0undary"
#: Every route that takes a body, with the Content-Type it takes.
ROUTES = {
    "POST /submit": "application/json",
    "POST /submit/batch": "application/json",
    "POST /v2/models/synthetic/infer": "application/json",
    "POST /v1/files": f"multipart/form-data; boundary={BOUNDARY}",
    "POST /v1/embeddings": "application/json",
    "POST /v1/batches": "application/json",
    "POST /v1/batches/batch_nope/cancel": "application/json",
    "PUT /models/synthetic/rollout": "application/json",
}
#: The methods whose body the web reads before any route (web/common/post_body.py).
BODY_METHODS = ("POST", "PUT", "PATCH")


@dataclass(frozen=True)
class Malformed:
    """A chunked body that breaks the framing, and the answer it must get."""

    body: bytes
    status: int
    says: str
    #: Half-close the connection after the body: the client stopped sending.
    hang_up: bool = False


CASES = {
    "chunk size not hex": Malformed(b"ZZ\r\n{}\r\n0\r\n\r\n", 400, "chunk size"),
    "negative chunk size": Malformed(b"-5\r\n{}\r\n0\r\n\r\n", 400, "chunk size"),
    "chunk without its CRLF": Malformed(b"2\r\n{}XX0\r\n\r\n", 400, "not '\\r\\n'"),
    "client closes mid-chunk": Malformed(b'40\r\n{"model": "synth', 408, "before its end",
                                         hang_up=True),
}


@dataclass(frozen=True)
class Web:
    base: str
    server: RedisProc
    prefix: str
    files: Path


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    files = tmp_path_factory.mktemp("bodies") / "files"
    with private_redis() as server:
        env = make_env(server.url, "bodies", CARPOOL_FILES_DIR=str(files))
        with start_web(env) as base:
            yield Web(base, server, "bodies", files)


def exchange(base: str, route: str, ctype: str, body: bytes, hang_up: bool,
             framing: str = "Transfer-Encoding: chunked") -> bytes:
    """Send ``route`` ("METHOD /path") with ``body`` (already framed) and read the whole
    answer."""
    host, port = base.removeprefix("http://").split(":")
    head = (f"{route} HTTP/1.1\r\nHost: t\r\nContent-Type: {ctype}\r\n"
            f"{framing}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=ANSWER_S) as s:
        s.sendall(head + body)
        if hang_up:
            s.shutdown(socket.SHUT_WR)  # still able to read the answer
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def status_and_message(raw: bytes) -> tuple[int, str]:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    assert match, raw[:200]
    _, _, body = raw.partition(b"\r\n\r\n")
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError):
        return int(match[1]), body[:200].decode(errors="replace")
    # /v2 answers the protocol's {"error": "<message>"}; the rest {"error": {"message"}}.
    return int(match[1]), error if isinstance(error, str) else error["message"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_chunked_body_answers_4xx_on_every_body_route_and_nothing_is_kept(
        web: Web, case: str) -> None:
    bad = CASES[case]
    wrong = []
    for route, ctype in ROUTES.items():
        status, message = status_and_message(exchange(web.base, route, ctype, bad.body,
                                                      bad.hang_up))
        if status != bad.status or bad.says not in message:
            wrong.append(f"{route}: {status} {message[:200]}")
    assert wrong == []
    with connect(web.server.url) as client:
        keys = Keys(web.prefix)
        assert client.keys(keys.any_bin_pattern) == []  # nothing admitted
        assert client.keys(keys.bulk("*")) + client.keys(keys.file("*")) == []
    assert not web.files.exists() or not any(web.files.rglob("*"))  # no file stored


def test_the_web_serves_a_well_formed_chunked_submit_after_malformed_ones(web: Web) -> None:
    for bad in CASES.values():
        exchange(web.base, "POST /submit", "application/json", bad.body, bad.hang_up)
    doc = b'{"model": "synthetic", "input": {"value": 1, "size": 1}}'
    good = b"%x\r\n%s\r\n0\r\n\r\n" % (len(doc), doc)
    status, _ = status_and_message(exchange(web.base, "POST /submit", "application/json", good,
                                            hang_up=False))
    assert status == 202
    assert requests.get(f"{web.base}/healthz", timeout=10).status_code == 200


def test_a_body_shorter_than_its_content_length_answers_408_not_a_parse_error(
        web: Web) -> None:
    status, message = status_and_message(exchange(
        web.base, "POST /submit", "application/json", b'{"model": "synth', hang_up=True,
        framing="Content-Length: 100"))
    assert status == 408
    assert "16 of the 100 bytes its Content-Length announced" in message


def compressed(web: Web, route: str, ctype: str = "application/json") -> tuple[int, str]:
    gzip_magic = b"\x1f\x8b\x08\x00"
    return status_and_message(exchange(
        web.base, route, ctype, gzip_magic, hang_up=False,
        framing=f"Content-Encoding: gzip\r\nContent-Length: {len(gzip_magic)}"))


def test_a_compressed_body_answers_415_on_every_body_route(web: Web) -> None:
    wrong = []
    for route, ctype in ROUTES.items():
        status, message = compressed(web, route, ctype)
        if status != 415 or "send it uncompressed" not in message:
            wrong.append(f"{route}: {status} {message[:200]}")
    assert wrong == []


def every_route_with_a_body(env: dict[str, str]) -> list[str]:
    """Each "METHOD /path" of the app's rules with a body method, its arguments filled."""
    with web_client(load_settings(env)) as http:
        rules = list(http.application.url_map.iter_rules())
    return [f"{method} {re.sub(r'<[^>]+>', 'x', rule.rule)}"
            for rule in rules for method in BODY_METHODS if method in (rule.methods or ())]


def test_every_route_and_method_with_a_body_reads_it_before_the_route(web: Web) -> None:
    """Whatever the blueprint, a PUT or PATCH as a POST: its body read within its limits
    and time, first (here refused as compressed), so none waits on a body unbounded."""
    routes = every_route_with_a_body(make_env(web.server.url, web.prefix))
    assert "PUT /models/x/rollout" in routes and "PATCH /v2/x" in routes
    wrong = [f"{route}: {status} {message[:120]}" for route in routes
             for status, message in [compressed(web, route)]
             if status != 415 or "send it uncompressed" not in message]
    assert wrong == []
