"""One webhook POST, made where the rules allow and nowhere else.

The URL is checked again (carpool/core/webhooks.py), its host resolved once, every
address it resolves to judged, and the connection made to that checked address, with
the name only in the Host header and the TLS server name: a DNS answer that changes
between the check and the connect (rebinding) cannot send the request elsewhere.
Redirects are never followed (http.client does not), each connect and read has a
timeout, and the whole try, DNS included, one deadline (``WebhookSettings.try_s``,
below the event's lease: dispatcher/deadlines.py cuts the connection there), so
no try outlives its lease and is sent twice; at most ``MAX_ANSWER_BYTES`` of the answer
are read; the rest goes with the connection.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import cache

from carpool.core.webhook_settings import WebhookSettings
from carpool.core.webhooks import IPAddress, Target, WebhookRefused, address_refusal, check_url
from dispatcher.deadlines import DEADLINES
from dispatcher.schedule import parse_retry_after

#: The answer's body is read this far, then dropped: a receiver has nothing to tell.
MAX_ANSWER_BYTES = 4096
#: An error message kept on the job is cut here.
MAX_ERROR_CHARS = 300

Resolver = Callable[[str, int], list[IPAddress]]

#: Threads for DNS lookups: getaddrinfo has no timeout of its own, so it runs on one of
#: these and a try waits for it only until its deadline; a lookup that hangs holds its
#: thread until the system resolver gives up.
RESOLVER_THREADS = 8


@cache
def _resolvers() -> ThreadPoolExecutor:
    """The process's lookup threads, made on the first lookup (never on import)."""
    return ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="carpool-hook-dns")


@dataclass(frozen=True)
class Answer:
    """How one try went: the HTTP status (None: no answer), why it failed, the wait the
    receiver asked for, and whether the target may never be called (no retry)."""

    status: int | None
    error: str | None = None
    retry_after_s: float | None = None
    refused: bool = False

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to, for TCP."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[IPAddress] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if ip not in out:
            out.append(ip)
    return out


#: A status that no status line has: ``_Response`` sets it before each read of one.
_NO_STATUS = 0


class _Response(http.client.HTTPResponse):
    """An answer read to its final status, past interim ones (103 Early Hints: http.client
    skips only 100), whose status stands when the headers after it are refused (over 100
    lines, a line over 64 KiB): the status alone says whether the receiver took the event.
    Leans on how ``HTTPResponse.begin`` reads: the status set, then the headers."""

    def begin(self) -> None:
        while True:
            self.status = _NO_STATUS
            try:
                super().begin()
            except http.client.HTTPException:
                if self.status == _NO_STATUS:
                    raise  # no status line: no answer
                self._drop_headers()
            if not 101 < self.status < 200:
                return
            # begin() reads the next answer only while this one's headers are unset.
            self.headers = self.msg = None  # type: ignore[assignment]

    def _drop_headers(self) -> None:
        """An answer with no headers and no body, its connection not reused."""
        self.headers = self.msg = http.client.HTTPMessage()
        self.chunked, self.length, self.will_close = False, 0, True


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP connection over a socket already connected to the checked address."""

    response_class = _Response

    def __init__(self, target: Target, sock: socket.socket, timeout_s: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout_s)
        self.default_port = 443 if target.scheme == "https" else 80  # the Host header's
        self.sock = sock

    def connect(self) -> None:  # never reached while self.sock is set; never reconnect
        raise http.client.HTTPException("connection closed; not reconnecting")


def post(url: str, body: bytes, headers: Mapping[str, str], settings: WebhookSettings,
         resolver: Resolver = resolve) -> Answer:
    """POST ``body`` to ``url``, within the rules and ``settings.try_s``; never raises
    for the network."""
    deadline = time.monotonic() + settings.try_s
    try:
        target = check_url(url, settings.allow_private)
    except WebhookRefused as exc:
        return Answer(None, _cut(str(exc)), refused=True)
    if target.address is not None:
        addresses = [target.address]
    else:
        lookup = _resolvers().submit(resolver, target.host, target.port)
        try:
            addresses = lookup.result(timeout=min(settings.connect_timeout_s,
                                                  deadline - time.monotonic()))
        except FutureTimeout:
            return Answer(None, f"cannot resolve {target.host}: no answer within "
                          f"{settings.connect_timeout_s:g} s")
        except (OSError, UnicodeError, ValueError) as exc:
            return Answer(None, _cut(f"cannot resolve {target.host}: {exc}"))
    if not addresses:
        return Answer(None, f"{target.host} resolves to no address")
    for ip in addresses:
        why = address_refusal(ip, settings.allow_private)
        if why is not None:
            return Answer(None, _cut(f"refused: {target.host} resolves to {why}"), refused=True)
    return _send(target, addresses[0], body, headers, settings, deadline)


def _send(target: Target, ip: IPAddress, body: bytes, headers: Mapping[str, str],
          settings: WebhookSettings, deadline: float) -> Answer:
    limit_s = settings.try_s
    try:
        sock = socket.create_connection(
            (str(ip), target.port),
            timeout=max(0.001, min(settings.connect_timeout_s, deadline - time.monotonic())))
    except OSError as exc:
        return Answer(None, _cut(f"connect to {ip} port {target.port}: {exc}"))
    try:
        with DEADLINES.bounded(sock, max(0.0, deadline - time.monotonic())) as bound:
            answer: http.client.HTTPResponse | None = None
            try:
                sock.settimeout(settings.read_timeout_s)
                if target.scheme == "https":
                    # The TLS socket takes the plain one's descriptor: bound it instead.
                    sock = bound.sock = ssl.create_default_context().wrap_socket(
                        sock, server_hostname=target.host)
                conn = _PinnedConnection(target, sock, settings.read_timeout_s)
                conn.request("POST", target.path, body=body, headers=dict(headers))
                answer = conn.getresponse()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                error = _cut(f"{type(exc).__name__}: {exc}")
            # Cut off mid-answer, http.client may read the cut as the answer's end: what
            # came is no answer, whatever it said. Only its status line and headers: once
            # they are in, a cut in the body changes nothing.
            if bound.cut:
                return Answer(None, f"the try took longer than {limit_s:g} s: cut off")
            if answer is None:
                return Answer(None, error)
            _drain(answer)
    finally:
        sock.close()
    return _judged(answer.status, answer.getheader("Retry-After"), answer.getheader("Location"))


def _drain(answer: http.client.HTTPResponse) -> None:
    """Read the body's first ``MAX_ANSWER_BYTES`` and drop them. The status is in, so a
    body that breaks off (a bad chunk, a reset, a timeout, the try's cut) is no failure."""
    try:
        answer.read(MAX_ANSWER_BYTES)
    except (OSError, http.client.HTTPException, ValueError):
        pass


def _judged(status: int, retry_after: str | None, location: str | None) -> Answer:
    """What the receiver's status says: a 2xx is delivered, whatever its headers say."""
    if 200 <= status < 300:
        return Answer(status)
    error = f"HTTP {status}"
    if 300 <= status < 400:
        error += f": redirects are not followed (Location: {(location or '')[:100]})"
    return Answer(status, error, parse_retry_after(retry_after, time.time()))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."
