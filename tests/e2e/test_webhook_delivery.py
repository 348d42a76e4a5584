"""One delivery against real sockets: the connection goes to the address that was
checked (a DNS answer cannot move it), a name with any forbidden address is refused
before a connection, an endless answer is cut after a few KiB, a silent receiver
times out, and a 2xx is delivered whatever malformed bytes follow its status line."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from carpool.core.webhook_settings import WebhookSettings
from carpool.core.webhooks import IPAddress
from dispatcher.delivery import MAX_ANSWER_BYTES, Answer, post
from tests.support.receiver import receiver

LOOPBACK = ipaddress.ip_address("127.0.0.1")
PRIVATE = WebhookSettings(allow_private=True, connect_timeout_s=1, read_timeout_s=1)


def test_the_connection_goes_to_the_checked_address_with_the_name_as_host() -> None:
    asked: list[str] = []

    def resolver(host: str, _port: int) -> list[IPAddress]:
        asked.append(host)
        return [LOOPBACK]

    with receiver() as rx:
        answer = post(f"http://rebind.example:{rx.port}/h?x=1", b"{}", {"webhook-id": "a"},
                      PRIVATE, resolver)
        assert answer.ok and answer.status == 200
        (got,) = rx.all()
    assert asked == ["rebind.example"]  # resolved once: what was checked is what is used
    assert got.headers["host"] == f"rebind.example:{rx.port}"
    assert got.path == "/h?x=1"


def test_a_name_with_one_forbidden_address_is_refused_without_a_connection() -> None:
    public = ipaddress.ip_address("93.184.215.14")
    with receiver() as rx:
        answer = post(f"http://mixed.example:{rx.port}/", b"{}", {},
                      WebhookSettings(connect_timeout_s=1, read_timeout_s=1),
                      lambda _h, _p: [public, LOOPBACK])
        assert answer.refused and "loopback" in (answer.error or "")
        assert rx.all() == []


@contextmanager
def raw_server(handle: object) -> Iterator[int]:
    """A TCP server on loopback whose one connection ``handle(conn)`` serves."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            handle(conn)  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def test_an_endless_answer_is_cut_after_a_few_kib() -> None:
    sent = [0]

    def endless(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        try:
            while sent[0] < 1 << 30:
                conn.sendall(b"x" * 65536)
                sent[0] += 65536
        except OSError:
            pass  # the dispatcher hung up: what this test wants

    with raw_server(endless) as port:
        t0 = time.monotonic()
        answer = post(f"http://127.0.0.1:{port}/", b"{}", {}, PRIVATE)
        assert answer.ok
        assert time.monotonic() - t0 < 5
    assert MAX_ANSWER_BYTES <= 4096 and sent[0] < 64 << 20


def test_a_receiver_that_never_answers_times_out() -> None:
    hold = threading.Event()
    with raw_server(lambda conn: hold.wait(10)) as port:
        t0 = time.monotonic()
        answer = post(f"http://127.0.0.1:{port}/", b"{}", {}, PRIVATE)
        hold.set()
    assert answer.status is None and "timed out" in (answer.error or "")
    assert time.monotonic() - t0 < 5


def test_a_refused_connection_is_an_error_to_retry_not_a_refusal() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answer = post(f"http://127.0.0.1:{port}/", b"{}", {}, PRIVATE)
    assert answer.status is None and not answer.refused and "connect" in (answer.error or "")


def test_a_receiver_trickling_its_headers_is_cut_off_at_the_whole_try_bound() -> None:
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        conn.recv(65536)
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.2):  # one header byte at a time, never the end
                conn.sendall(b"X")
        except OSError:
            pass

    with raw_server(trickle) as port:
        t0 = time.monotonic()
        answer = post(f"http://127.0.0.1:{port}/", b"{}", {}, PRIVATE)
        took_s = time.monotonic() - t0
        stop.set()
    assert answer.status is None and "cut off" in (answer.error or "")
    assert took_s < 4  # connect + read timeout (2 s) and the shutdown's wake-up


def test_https_verifies_the_receivers_certificate_against_the_name(tmp_path: Path) -> None:
    """A self-signed certificate is refused (the default trust store), so a receiver
    that cannot prove the name gets no body; the error says why."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=hooks.example", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    got: list[bytes] = []

    def tls(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls_conn:
                got.append(tls_conn.recv(65536))
        except (ssl.SSLError, OSError):
            pass  # the dispatcher refused the certificate: what this test wants

    with raw_server(tls) as port:
        answer = post(f"https://hooks.example:{port}/", b"{}", {}, PRIVATE,
                      lambda _h, _p: [LOOPBACK])
    assert answer.status is None and "CERTIFICATE_VERIFY_FAILED" in (answer.error or "")
    assert got == []


def test_a_resolver_that_hangs_fails_the_try_within_its_deadline() -> None:
    """getaddrinfo has no timeout: a try waits for it no longer than the connect timeout,
    so the whole try ends inside try_s (below its lease) and cannot be sent twice."""
    hold = threading.Event()

    def hanging(_host: str, _port: int) -> list[IPAddress]:
        hold.wait(30)
        return [LOOPBACK]

    t0 = time.monotonic()
    try:
        answer = post("http://slow-dns.example/", b"{}", {}, PRIVATE, hanging)
    finally:
        hold.set()
    assert answer.status is None and not answer.refused
    assert "cannot resolve slow-dns.example" in (answer.error or "")
    assert time.monotonic() - t0 < PRIVATE.try_s


def answered(raw: bytes, hold: bool = False) -> Answer:
    """The try's outcome against a receiver that sends ``raw`` whatever it is asked, then
    closes the connection, or holds it open (``hold``) until the try is over."""
    over = threading.Event()

    def handle(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(raw)
        if hold:
            over.wait(10)

    with raw_server(handle) as port:
        try:
            return post(f"http://127.0.0.1:{port}/", b"{}", {}, PRIVATE)
        finally:
            over.set()


OK_LINE = b"HTTP/1.1 200 OK\r\n"
#: Receivers' answers that said 2xx but broke something after the status line: each one
#: took the event, so none may be tried again.
HOSTILE_2XX = {
    "retry-after-superscript-two": OK_LINE + b"Retry-After: \xb2\r\nContent-Length: 0\r\n\r\n",
    "retry-after-utf8-digits": OK_LINE + "Retry-After: ١٢\r\n\r\n".encode(),
    "content-length-superscript": OK_LINE + b"Content-Length: \xb2\r\n\r\nok",
    "content-length-negative": OK_LINE + b"Content-Length: -1\r\n\r\nok",
    "content-length-twice": OK_LINE + b"Content-Length: 2, 3\r\n\r\nok",
    "content-length-unmet": OK_LINE + b"Content-Length: 100\r\n\r\nok",
    "non-utf8-header": OK_LINE + b"X-Name: \xff\xfe\xc3(\r\nContent-Length: 0\r\n\r\n",
    "bad-chunk-size": OK_LINE + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n",
    "chunks-cut-short": OK_LINE + b"Transfer-Encoding: chunked\r\n\r\n5\r\nok",
    "101-headers": OK_LINE + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
    "70-kb-header-line": OK_LINE + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n",
    "early-hints-first": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK_LINE
                         + b"Content-Length: 0\r\n\r\n",
    "204-with-a-body": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
}


@pytest.mark.parametrize("raw", HOSTILE_2XX.values(), ids=HOSTILE_2XX.keys())
def test_a_2xx_is_delivered_whatever_breaks_after_its_status_line(raw: bytes) -> None:
    answer = answered(raw)
    assert answer.ok and answer.error is None, answer


def test_a_2xx_whose_body_never_comes_is_delivered_after_the_read_timeout() -> None:
    t0 = time.monotonic()
    answer = answered(OK_LINE + b"Content-Length: 10\r\n\r\n", hold=True)
    assert answer.ok and answer.error is None, answer
    assert time.monotonic() - t0 < PRIVATE.try_s


def test_an_unreadable_retry_after_on_a_503_is_a_plain_retry() -> None:
    answer = answered(b"HTTP/1.1 503 Busy\r\nRetry-After: \xb2\r\nContent-Length: 0\r\n\r\n")
    assert answer.status == 503 and answer.error == "HTTP 503"
    assert answer.retry_after_s is None


def test_a_status_line_with_no_ascii_status_is_no_answer() -> None:
    answer = answered(b"HTTP/1.1 \xb200 OK\r\nContent-Length: 0\r\n\r\n")
    assert answer.status is None and "BadStatusLine" in (answer.error or "")
