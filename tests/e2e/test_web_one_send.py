"""Real gunicorn answers a submit in one TCP data segment: head and body in one send
(web/common/one_send.py), as the client's kernel counts what it received."""

from __future__ import annotations

import json
import socket
import struct

import pytest

from tests.conftest import make_env
from tests.support.procs import start_web

TIMEOUT_S = 10.0
#: ``tcpi_data_segs_in`` in Linux's ``struct tcp_info`` (since 4.6): segments
#: received that carried data, ACKs and the handshake not counted.
DATA_SEGS_IN_OFFSET = 152
TCP_INFO_BYTES = 160


def data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    if len(info) < TCP_INFO_BYTES:
        pytest.skip("this kernel's tcp_info has no count of data segments received")
    (count,) = struct.unpack_from("I", info, DATA_SEGS_IN_OFFSET)
    return int(count)


def answered(port: int, request: bytes) -> tuple[bytes, int]:
    """The whole answer to ``request`` (which asks to close) and the data segments
    it came in."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
        s.sendall(request)
        out = bytearray()
        while chunk := s.recv(65536):
            out += chunk
        return bytes(out), data_segments_in(s)


def test_gunicorn_answers_a_submit_and_an_error_each_in_one_segment(
        redis_url: str, key_prefix: str) -> None:
    body = json.dumps({"model": "synthetic", "input": {"value": "v", "size": 1}}).encode()
    submit = (b"POST /submit HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
              + body)
    missing = b"GET /result/no-such-job HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    with start_web(make_env(redis_url, key_prefix)) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        for request, status in ((submit, b"202"), (missing, b"404")):
            answer, segments = answered(port, request)
            head, _, rest = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 " + status) and json.loads(rest), answer
            assert segments == 1, f"{segments} data segments for one answer"
