"""Real gunicorn sheds the next submit on a kept-alive connection before parsing it
(web/common/keepalive_shedding.py), after its worker's event loop stalled (SIGSTOP)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
import requests

from tests.conftest import make_env
from tests.e2e.test_web_shedding_gunicorn import (
    HOSTILE,
    SUBMIT,
    TIMEOUT_S,
    all_sheds,
    assert_refused_unparsed,
    gunicorn_workers,
    read_all,
    wait_served,
)
from tests.support.procs import start_web
from tests.support.promtext import Scrape

#: Small, so that the lag a stall of STALL_S leaves behind passes half of it for about
#: 0.6 s after the worker resumes (the lag halves every 0.1 s).
BOUND_MS = 50
#: Shorter than gunicorn's keep-alive timeout (2 s): it would close the idle connection
#: as the worker resumes.
STALL_S = 1.5
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"


def kept_alive_submit() -> bytes:
    body = json.dumps(SUBMIT).encode()
    return (b"POST /submit HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def read_one(s: socket.socket) -> tuple[list[bytes], bytes]:
    """(the head's lines, the body) of one answer on a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data  # the connection is kept alive, not closed
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += s.recv(65536)
    return lines, body


def kept_after_a_stall(base_url: str) -> socket.socket:
    """A connection kept alive across a stall of its worker: its next request comes
    as the worker's event loop is still late by about STALL_S."""
    port = int(base_url.rsplit(":", 1)[1])
    (worker,) = gunicorn_workers(base_url)
    kept = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    kept.sendall(HEALTHZ)
    assert read_one(kept)[0][0].split()[1] == b"200"
    os.kill(worker, signal.SIGSTOP)
    try:
        kept.sendall(HEALTHZ)  # parsed as the worker resumes: a read is served
        time.sleep(STALL_S)  # the stall itself, not a wait for work
    finally:
        os.kill(worker, signal.SIGCONT)
    assert read_one(kept)[0][0].split()[1] == b"200"
    return kept


def test_the_next_submit_on_a_kept_alive_connection_is_refused_unparsed_after_a_stall(
        redis_url: str, key_prefix: str) -> None:
    """Refused by the parser (no Server header: gunicorn wrote nothing), the connection
    kept for the client's next request."""
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="1",
                   CARPOOL_WEB_MAX_QUEUE_MS=str(BOUND_MS))
    with start_web(env) as base_url:
        with kept_after_a_stall(base_url) as kept:
            kept.sendall(kept_alive_submit())  # behind the stall's lag: refused unparsed
            lines, body = read_one(kept)
            kept.sendall(HEALTHZ)
            assert read_one(kept)[0][0].split()[1] == b"200"
        assert_refused_unparsed(lines, body, b"keep-alive")
        assert all_sheds(base_url) == 1
        scrape = Scrape(requests.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text)
        assert scrape.value("carpool_web_refusal_seconds_count") == 1
        assert scrape.value("carpool_jobs_submitted_total", model="synthetic") == 0
        wait_served(base_url)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_next_requests_on_a_kept_alive_connection_are_left_to_gunicorn(
        redis_url: str, key_prefix: str, name: str) -> None:
    """Malformed and hostile requests sent on a kept-alive connection under pressure:
    each is gunicorn's to answer (a 400, or the shed in front of Flask), and the web
    serves the next submit."""
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="1",
                   CARPOOL_WEB_MAX_QUEUE_MS=str(BOUND_MS))
    with start_web(env) as base_url:
        with kept_after_a_stall(base_url) as kept:
            kept.sendall(kept_alive_submit())  # the web is still pressed: refused unparsed
            assert_refused_unparsed(*read_one(kept), b"keep-alive")
            kept.sendall(HOSTILE[name])
            kept.shutdown(socket.SHUT_WR)  # all there is: an answer or a close must follow
            answer = read_all(kept)
        if answer:  # gunicorn's parse: a refusal, never a 5xx but the shed's 503
            status = int(answer.split()[1])
            assert status in (400, 413, 431, 503), answer[:200]
            if status == 503:  # shed once gunicorn parsed it, not before
                assert b"\r\nServer: " in answer.partition(b"\r\n\r\n")[0], answer[:300]
        wait_served(base_url)
