"""A request read, without taking its bytes, from a socket's receive buffer: the little
of HTTP/1.x that shedding before gunicorn needs (web/common/accept_shedding.py,
web/common/keepalive_shedding.py). Anything it is unsure of is None: gunicorn's to parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A header name or method as RFC 9110 5.6.2 has it (a token): gunicorn refuses the
#: rest, so a request with anything else (a space before a colon, an obs-fold line) is
#: its to answer, never framed here another way than it would frame it.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True)
class PeekedRequest:
    """What is read of a request still in the kernel's buffer."""

    method: str
    path: str
    #: Its bytes, head and body: what is read out of the socket before answering.
    length: int
    #: Whether its client keeps the connection open after the answer (RFC 9112 9.3:
    #: HTTP/1.1 unless ``Connection: close``; HTTP/1.0 with ``Connection: keep-alive``).
    keep_alive: bool = False


def whole_request(data: bytes) -> PeekedRequest | None:
    """The request ``data`` starts with, when it is a whole HTTP/1.x request with a
    Content-Length body (or none); None for anything else."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = data[:head_end]
    if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
        return None  # a bare CR or LF: gunicorn's to refuse
    line, _, fields = head.partition(b"\r\n")
    parts = line.split(b" ")
    if (len(parts) != 3 or parts[2] not in (b"HTTP/1.0", b"HTTP/1.1")
            or not _TOKEN.fullmatch(parts[0])):
        return None
    length, seen_length = 0, False
    options: set[bytes] = set()
    for field in fields.split(b"\r\n"):
        name, colon, value = field.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            return None  # no colon, a space before it, or a folded line
        name = name.lower()
        if name == b"transfer-encoding":
            return None  # chunked: gunicorn's to read
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or seen_length:
                return None  # gunicorn's to refuse: a bad length, or two
            length, seen_length = int(value), True
        elif name == b"connection":
            options.update(token.strip().lower() for token in value.split(b","))
    total = head_end + 4 + length
    if total > len(data):
        return None
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    keep_alive = b"close" not in options and (parts[2] == b"HTTP/1.1"
                                              or b"keep-alive" in options)
    return PeekedRequest(method, target.partition("?")[0], total, keep_alive)
