"""Real gunicorn sheds a submit that waited in it: by X-Request-Start, and after its
worker's event loop stalled (SIGSTOP), as the lag monitor saw it."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import requests

from carpool.stack.waiting import wait_until
from tests.conftest import make_env
from tests.support.procs import start_web
from tests.support.promtext import Scrape

SUBMIT = {"model": "synthetic", "input": {"value": "v", "size": 1}}
TIMEOUT_S = 10.0
#: How long the worker is stopped: well past the lag test's bound.
STALL_S = 1.5
LAG_BOUND_MS = 300
#: The X-Request-Start test's bound: far above any lag a busy test machine causes,
#: so only the stamp decides.
STAMP_BOUND_MS = 5000


def shed_count(base_url: str, reason: str) -> float:
    text = requests.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text
    return Scrape(text).value("carpool_web_shed_total", reason=reason)


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()]


def gunicorn_workers(base_url: str) -> list[int]:
    """The worker processes of the gunicorn that serves ``base_url``."""
    port = base_url.rsplit(":", 1)[1]
    masters = [pid for pid in children(os.getpid())
               if f"127.0.0.1:{port}" in Path(f"/proc/{pid}/environ").read_bytes().decode(
                   errors="replace")]
    assert len(masters) == 1, masters
    return children(masters[0])


def raw_submit(port: int) -> socket.socket:
    """A socket that has sent a whole submit; the kernel holds it if nobody reads."""
    body = json.dumps(SUBMIT).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    s.sendall(b"POST /submit HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def read_all(s: socket.socket) -> bytes:
    out = bytearray()
    while chunk := s.recv(65536):
        out += chunk
    return bytes(out)


def sent_in_a_stall(base_url: str, requests_sent: list[bytes]) -> list[socket.socket]:
    """New connections, each having sent one of ``requests_sent`` (and no more) while
    the web's workers were stopped for STALL_S: the accept loops find each whole in the
    kernel's buffer, the loops late and the bytes old."""
    workers = gunicorn_workers(base_url)
    port = int(base_url.rsplit(":", 1)[1])
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        socks = []
        for data in requests_sent:
            s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
            socks.append(s)
            s.sendall(data)  # on loopback, in the server's buffer once sendall returns
            s.shutdown(socket.SHUT_WR)  # all there is: an answer or a close must follow
        time.sleep(STALL_S)  # the stall itself, not a wait for work
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    return socks


def all_sheds(base_url: str) -> float:
    text = requests.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text
    return sum(Scrape(text).value("carpool_web_shed_total", reason=reason)
               for reason in ("queued", "listen_backlog", "event_loop_lag", "request_start"))


def wait_served(base_url: str) -> None:
    def served() -> bool:  # the lag decays once the loop is on time again
        resp = requests.post(f"{base_url}/submit", json=SUBMIT, timeout=TIMEOUT_S)
        assert resp.status_code in (202, 503), resp.text
        return resp.status_code == 202

    wait_until(served, TIMEOUT_S, "a submit served after the stall")


def submit_bytes(extra: bytes = b"", length: int | None = None,
                 body: bytes = json.dumps(SUBMIT).encode()) -> bytes:
    size = len(body) if length is None else length
    return (b"POST /submit?wait=5 HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\n" + extra
            + f"Content-Length: {size}\r\n\r\n".encode() + body)


def test_gunicorn_sheds_a_submit_by_its_proxy_start_time(redis_url: str,
                                                          key_prefix: str) -> None:
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_MAX_QUEUE_MS=str(STAMP_BOUND_MS))
    with start_web(env) as base_url:
        old = {"X-Request-Start": f"t={int((time.time() - 60) * 1e6)}"}  # µs, a minute ago
        resp = requests.post(f"{base_url}/submit", json=SUBMIT, headers=old, timeout=TIMEOUT_S)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "overloaded"
        assert resp.headers["Retry-After"] == "1"
        assert shed_count(base_url, "request_start") == 1
        fresh = {"X-Request-Start": f"t={time.time():.3f}"}  # seconds, now
        resp = requests.post(f"{base_url}/submit", json=SUBMIT, headers=fresh, timeout=TIMEOUT_S)
        assert resp.status_code == 202, resp.text
        assert requests.get(f"{base_url}/healthz", headers=old, timeout=TIMEOUT_S).ok
        assert shed_count(base_url, "request_start") == 1


def test_gunicorn_sheds_a_submit_that_waited_out_a_stalled_event_loop(
        redis_url: str, key_prefix: str) -> None:
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="1",
                   CARPOOL_WEB_MAX_QUEUE_MS=str(LAG_BOUND_MS))
    with start_web(env) as base_url:
        (waiting,) = sent_in_a_stall(base_url, [submit_bytes()])  # the loop cannot run
        with waiting:
            head, _, body = read_all(waiting).partition(b"\r\n\r\n")
        assert head.split()[1] == b"503", head
        assert b"\r\nRetry-After: 1\r\n" in head + b"\r\n"
        assert json.loads(body)["error"]["code"] == "overloaded"
        assert shed_count(base_url, "event_loop_lag") == 1
        wait_served(base_url)


#: The queued test's bound: far above any event-loop lag a busy test machine causes,
#: far below how long its submit waits in the accept queue (HOLD_S).
QUEUED_BOUND_MS = 1000
#: How long the long-polls that fill the worker's two connection slots hold them.
HOLD_S = 3


def raw_poll(port: int, job_id: str) -> socket.socket:
    """A long-poll that holds one of the worker's connection slots for HOLD_S."""
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    s.sendall(f"GET /result/{job_id}?wait={HOLD_S} HTTP/1.1\r\nHost: test\r\n"
              "Connection: close\r\n\r\n".encode())
    return s


def test_gunicorn_sheds_a_submit_that_waited_in_the_accept_queue_without_a_proxy(
        redis_url: str, key_prefix: str) -> None:
    """No X-Request-Start and an idle event loop: only the kernel saw the wait."""
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="1",
                   CARPOOL_WEB_WORKER_CONNECTIONS="2",
                   CARPOOL_WEB_MAX_QUEUE_MS=str(QUEUED_BOUND_MS))
    with start_web(env) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        job = requests.post(f"{base_url}/submit", json=SUBMIT, timeout=TIMEOUT_S)
        assert job.status_code == 202, job.text  # no worker: it stays queued
        polls = [raw_poll(port, job.json()["id"]) for _ in range(2)]
        # Both slots taken (the accept queue is first in, first out): this submit
        # waits in the kernel until a poll ends, HOLD_S from now.
        waiting = raw_submit(port)
        with waiting:
            head, _, body = read_all(waiting).partition(b"\r\n\r\n")
        for poll in polls:
            with poll:
                assert read_all(poll).split()[1] == b"200"
        assert head.split()[1] == b"503", head
        assert b"\r\nRetry-After: 1\r\n" in head + b"\r\n"
        assert json.loads(body)["error"]["code"] == "overloaded"
        assert shed_count(base_url, "queued") == 1
        assert shed_count(base_url, "event_loop_lag") == 0
        # The refusal is timed from its bytes reaching the host: the accept queue's wait in.
        scrape = Scrape(requests.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text)
        assert scrape.value("carpool_web_refusal_seconds_count") == 1
        assert scrape.value("carpool_web_refusal_seconds_sum") > QUEUED_BOUND_MS / 1000


def test_an_unloaded_gunicorn_sheds_nothing(redis_url: str, key_prefix: str) -> None:
    """The default bound, one request at a time: every kernel-side reading stays small."""
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="1")
    with start_web(env) as base_url, requests.Session() as session:
        for _ in range(30):  # on kept-alive connections and fresh ones alike
            resp = session.post(f"{base_url}/submit", json=SUBMIT, timeout=TIMEOUT_S)
            assert resp.status_code == 202, resp.text
            resp = requests.post(f"{base_url}/submit?wait=0.01", json=SUBMIT, timeout=TIMEOUT_S)
            assert resp.status_code == 202, resp.text
        text = requests.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text
        for reason in ("queued", "listen_backlog", "event_loop_lag", "request_start"):
            assert Scrape(text).value("carpool_web_shed_total", reason=reason) == 0


def answer_to(port: int, request: bytes) -> tuple[list[bytes], bytes]:
    """(the head's lines, the body) of the answer to ``request`` on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
        s.sendall(request)
        head, _, body = read_all(s).partition(b"\r\n\r\n")
    return head.split(b"\r\n"), body


def assert_refused_unparsed(lines: list[bytes], body: bytes, connection: bytes) -> None:
    """``lines`` (an answer's head) and ``body`` are the shed's 503, written before
    gunicorn parsed the request (no Server header), with ``Connection: <connection>``."""
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable", lines
    assert b"Connection: " + connection in lines and b"Retry-After: 1" in lines
    assert not any(line.lower().startswith(b"server:") for line in lines), lines
    assert json.loads(body)["error"]["code"] == "overloaded"


def test_a_submit_that_waited_for_its_accept_is_refused_there(
        redis_url: str, key_prefix: str) -> None:
    """Shed in the accept loop, gunicorn never parsing it (so no Server header);
    counted as every shed is, and no job queued."""
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="1",
                   CARPOOL_WEB_MAX_QUEUE_MS=str(LAG_BOUND_MS))
    with start_web(env) as base_url:
        assert requests.get(f"{base_url}/healthz", timeout=TIMEOUT_S).ok
        (waiting,) = sent_in_a_stall(base_url, [submit_bytes()])
        with waiting:
            head, _, body = read_all(waiting).partition(b"\r\n\r\n")
        assert_refused_unparsed(head.split(b"\r\n"), body, b"close")
        assert all_sheds(base_url) == 1
        scrape = Scrape(requests.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text)
        assert scrape.value("carpool_web_refusal_seconds_count") == 1
        assert scrape.value("carpool_web_refusal_seconds_sum") > LAG_BOUND_MS / 1000
        assert scrape.value("carpool_jobs_submitted_total", model="synthetic") == 0
        wait_served(base_url)


def test_a_stamped_submit_on_a_calm_web_is_shed_once_parsed(
        redis_url: str, key_prefix: str) -> None:
    """A proxy's stamp alone, on a new connection, a kept-alive one or with a chunked
    body: the judge in front of Flask sheds it (gunicorn parsed it: a Server header)."""
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_MAX_QUEUE_MS=str(STAMP_BOUND_MS))
    stamp = f"X-Request-Start: t={int((time.time() - 60) * 1e6)}\r\n".encode()
    chunk = json.dumps(SUBMIT).encode()
    chunked = (submit_bytes(stamp + b"Transfer-Encoding: chunked\r\n", body=b"")
               .replace(b"Content-Length: 0\r\n", b"")
               + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n")
    with start_web(env) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        for n, request in enumerate((submit_bytes(stamp), chunked), start=1):
            lines, _ = answer_to(port, request)
            assert lines[0].split()[1] == b"503" and any(
                line.lower().startswith(b"server:") for line in lines), lines
            assert shed_count(base_url, "request_start") == n
        with requests.Session() as session:  # a kept-alive connection
            assert session.get(f"{base_url}/healthz", timeout=TIMEOUT_S).ok
            old = {"X-Request-Start": stamp.decode().split(": ")[1].strip()}
            resp = session.post(f"{base_url}/submit", json=SUBMIT, headers=old,
                                timeout=TIMEOUT_S)
        assert resp.status_code == 503 and "Server" in resp.headers, resp.headers
        assert shed_count(base_url, "request_start") == 3


#: Malformed and hostile first requests that waited for their accept: each is left to
#: gunicorn (a 400, or the shed in front of Flask), and the web serves the next submit.
HOSTILE = {
    "duplicate lengths": submit_bytes(b"Content-Length: 3\r\n"),
    "a length past the body": submit_bytes(length=10_000),
    "no end of head": submit_bytes().split(b"\r\n\r\n")[0],
    "pipelined": submit_bytes() + submit_bytes(),
    "an HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "a TLS hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
    "a head past the peek": submit_bytes(b"X-Pad: " + b"a" * 20_000 + b"\r\n"),
    "a space before a colon": submit_bytes().replace(b"Content-Length:", b"Content-Length :"),
    "a folded header": submit_bytes(b"X-A: 1\r\n  folded\r\n"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_first_requests_are_left_to_gunicorn_and_break_nothing(
        redis_url: str, key_prefix: str, name: str) -> None:
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="1",
                   CARPOOL_WEB_MAX_QUEUE_MS=str(LAG_BOUND_MS))
    with start_web(env) as base_url:
        assert requests.get(f"{base_url}/healthz", timeout=TIMEOUT_S).ok
        (s,) = sent_in_a_stall(base_url, [HOSTILE[name]])
        with s:
            answer = read_all(s)
        if answer:  # gunicorn's parse: a refusal, never a 5xx but the shed's 503
            status = int(answer.split()[1])
            assert status in (400, 413, 431, 503), answer[:200]
            if status == 503:  # shed once gunicorn parsed it, not at accept
                assert b"\r\nServer: " in answer.partition(b"\r\n\r\n")[0], answer[:300]
        wait_served(base_url)


def test_two_workers_refuse_a_queued_burst_unparsed_and_serve_the_rest(
        redis_url: str, key_prefix: str) -> None:
    """As shipped (several workers, gunicorn's one connection a turn): after a stall,
    the accept loops refuse the queued submits in bursts and hand the reads over."""
    env = make_env(redis_url, key_prefix, CARPOOL_WEB_WORKERS="2",
                   CARPOOL_WEB_MAX_QUEUE_MS=str(LAG_BOUND_MS))
    with start_web(env) as base_url:
        assert requests.get(f"{base_url}/healthz", timeout=TIMEOUT_S).ok
        assert len(gunicorn_workers(base_url)) == 2
        read = b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
        socks = sent_in_a_stall(base_url, [submit_bytes()] * 150 + [read] * 5)
        submits, reads = socks[:150], socks[150:]
        for s in submits:
            with s:
                head = read_all(s).partition(b"\r\n\r\n")[0]
            assert head.startswith(b"HTTP/1.1 503 "), head
            assert b"\r\nServer: " not in head, head  # refused unparsed
        for r in reads:
            with r:
                assert read_all(r).split()[1] == b"200"
        assert all_sheds(base_url) == 150
        wait_served(base_url)
