"""One delivery against real sockets: the connection goes to the address that was
checked (a DNS answer cannot move it), a name with any forbidden address is refused
before a connection, an endless answer is cut after a few KiB, and a silent receiver
times out."""

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

from carpool.core.webhook_settings import WebhookSettings
from carpool.core.webhooks import IPAddress
from dispatcher.delivery import MAX_ANSWER_BYTES, post
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
