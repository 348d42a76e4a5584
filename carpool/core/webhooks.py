"""Webhooks as a submit asks for them: the events, the target URL and its checks.

A submit may name ``webhook`` (an http or https URL) and ``webhook_events`` (any of
``EVENTS``; default: the terminal ones). Both are checked here, once at submit (the web)
and again before every delivery (the dispatcher, after DNS resolution:
dispatcher/delivery.py), by the same rules, so no request goes where the operator
did not allow it (docs/webhooks.md, "Where a webhook may go").

The job's record keeps the subscription as one header field, ``hook``
(carpool/backend/records.py): the events' letters, a space, the URL
(``carpool.core.wire.HookField``). A URL holds no
tab, newline or space (``check_url`` refuses them), so the field never breaks the
record's tab-separated header.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit

from carpool.core.errors import InvalidInput
from carpool.core.wire import EVENT_LETTERS, HookField

EVENTS: Final = tuple(EVENT_LETTERS)
#: What a submit without ``webhook_events`` is told about: the job's end, however it ends.
DEFAULT_EVENTS: Final = ("done", "failed", "expired", "cancelled")
#: Longer URLs are refused: browsers and proxies stop near 2 KiB, and the URL is stored
#: with every record of the job and every event of its outbox.
MAX_URL_CHARS: Final = 2048
SCHEMES: Final = ("http", "https")
#: Names that resolve to this host (RFC 6761) or to a cloud's metadata service by
#: convention: refused at submit without a lookup.
LOCAL_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                                "ip6-loopback", "metadata", "metadata.google.internal",
                                "instance-data", "instance-data.ec2.internal"})
#: Cloud metadata services (AWS, ECS, Alibaba, Oracle, Azure's wire server): refused
#: even with CARPOOL_WEBHOOK_ALLOW_PRIVATE=1, which is for receivers on private
#: networks, never for a cloud's credentials.
METADATA_ADDRESSES: Final = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200",
    "192.0.0.192", "168.63.129.16"))
#: Link-local networks, refused even with CARPOOL_WEBHOOK_ALLOW_PRIVATE=1: no receiver
#: lives there, and clouds keep more metadata-like services there than any list names.
LINK_LOCAL: Final = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
#: An IPv4 host written as one number, hex or octal ("2130706433", "0x7f.1"): the
#: resolver reads these as addresses, so they are judged as the address they name.
_NUMERIC_HOST: Final = re.compile(r"[0-9a-fA-FxX.]+")
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookRefused(InvalidInput):
    """Raised when a webhook URL may not be called: bad syntax, scheme or address."""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL, split: what the dispatcher connects to."""

    url: str
    scheme: str
    host: str  # no brackets for IPv6
    port: int
    path: str  # with its query, never empty
    address: IPAddress | None  # when the host is an address literal


def address_refusal(ip: IPAddress, allow_private: bool) -> str | None:
    """Why a request may not go to ``ip``; None when it may."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        if embedded is not None:
            return address_refusal(embedded, allow_private)
    if ip in METADATA_ADDRESSES:
        return f"{ip} is a cloud metadata address"
    if any(ip in net for net in LINK_LOCAL):
        return f"{ip} is a link-local address (refused even where private ones are allowed)"
    if allow_private:
        return None
    for name, flag in (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
                       ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                       ("reserved", ip.is_reserved), ("private", ip.is_private)):
        if flag:
            return f"{ip} is a {name} address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None


def check_url(raw: Any, allow_private: bool) -> Target:
    """``raw`` as a ``Target``; raises ``WebhookRefused`` with what to change.

    Judges what can be judged without the network: the syntax, the scheme, credentials,
    an address literal, and names that always mean this host or a metadata service. A
    name's addresses are judged at each delivery, after it is resolved.
    """
    if not isinstance(raw, str):
        raise WebhookRefused(f"webhook must be a string (an http or https URL), not "
                             f"{type(raw).__name__}")
    if len(raw) > MAX_URL_CHARS:
        raise WebhookRefused(f"webhook URL is {len(raw)} characters; at most {MAX_URL_CHARS}")
    if not raw.isascii() or not raw.isprintable() or any(c.isspace() for c in raw):
        raise WebhookRefused("webhook URL must be printable ASCII without spaces: "
                             "percent-encode other characters (IDNA for host names)")
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"webhook URL {raw[:80]!r} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise WebhookRefused(f"webhook URL scheme {parts.scheme[:20]!r} is not allowed: "
                             "use http:// or https://")
    if "@" in parts.netloc:
        raise WebhookRefused("webhook URL must not carry credentials (user:pass@): the "
                             "receiver checks the webhook-signature header instead")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookRefused(f"webhook URL {raw[:80]!r} names no host")
    if port == 0:
        raise WebhookRefused("webhook URL port must be 1-65535")
    address = _address_of(host)
    if address is not None:
        why = address_refusal(address, allow_private)
        if why is not None:
            raise WebhookRefused(f"webhook URL refused: {why}; carpool calls only public "
                                 "addresses (an operator allows private ones with "
                                 "CARPOOL_WEBHOOK_ALLOW_PRIVATE=1)")
    elif host.lower() in LOCAL_NAMES or host.lower().endswith(".localhost"):
        if not allow_private or host.lower().startswith(("metadata", "instance-data")):
            raise WebhookRefused(f"webhook URL refused: {host!r} names this host or a "
                                 "metadata service; use a public name")
    return Target(raw, scheme, host, port or (443 if scheme == "https" else 80),
                  _path(parts), address)


def _address_of(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone id is cut
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _path(parts: SplitResult) -> str:
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


def check_events(raw: Any) -> tuple[str, ...]:
    """``webhook_events`` as a tuple of event names; raises ``InvalidInput``."""
    if raw is None:
        return DEFAULT_EVENTS
    if not isinstance(raw, list) or not raw or len(raw) > len(EVENTS):
        raise InvalidInput(f"webhook_events must be a non-empty list of events, any of "
                           f"{list(EVENTS)}")
    for event in raw:
        if not isinstance(event, str) or event not in EVENT_LETTERS:
            shown = event[:40] if isinstance(event, str) else type(event).__name__
            raise InvalidInput(f"webhook_events: unknown event {shown!r}; "
                               f"allowed: {list(EVENTS)}")
    return tuple(e for e in EVENTS if e in raw)


def hook_field(url: str, events: Iterable[str]) -> str:
    """The record's ``hook`` field for a checked URL and events (carpool/core/wire.py)."""
    return HookField(tuple(events), url).encode()


def webhook_option(doc: Any, allow_private: bool) -> str:
    """The ``hook`` field for a submit's ``webhook`` and ``webhook_events`` ("" none)."""
    url, events = doc.get("webhook"), doc.get("webhook_events")
    if url is None:
        if events is not None:
            raise InvalidInput("webhook_events needs a webhook URL to send them to")
        return ""
    target = check_url(url, allow_private)
    return hook_field(target.url, check_events(events))
