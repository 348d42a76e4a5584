"""Webhook URLs and events as a submit gives them: the malformed-input corpus, and the
addresses no webhook may go to (carpool/core/webhooks.py)."""

from __future__ import annotations

import ipaddress

import pytest

from carpool.backend import records
from carpool.core.errors import InvalidInput
from carpool.core.webhooks import (
    DEFAULT_EVENTS,
    MAX_URL_CHARS,
    WebhookRefused,
    address_refusal,
    check_events,
    check_url,
    hook_field,
    webhook_option,
)
from carpool.core.wire import HookField

#: (URL, a word the refusal must say): every one a 400 at submit.
BAD_URLS = [
    ("file:///etc/passwd", "scheme"),
    ("ftp://example.com/x", "scheme"),
    ("gopher://example.com/", "scheme"),
    ("javascript:alert(1)", "scheme"),
    ("//example.com/x", "scheme"),
    ("example.com/x", "scheme"),
    ("", "scheme"),
    ("http://", "no host"),
    ("http:///path", "no host"),
    ("http://user:pass@example.com/", "credentials"),
    ("http://user@example.com/", "credentials"),
    ("http://example.com:99999/", "valid URL"),
    ("http://example.com:0/", "port"),
    ("http://example.com:-1/", "valid URL"),
    ("http://[::1/", "valid URL"),
    ("http://exa mple.com/", "spaces"),
    ("http://example.com/\tx", "spaces"),
    ("http://example.com/\nx", "spaces"),
    ("http://example.com/\x00", "printable"),
    ("http://exämple.com/", "ASCII"),
    ("http://example.com/" + "a" * MAX_URL_CHARS, "characters"),
    ("http://127.0.0.1/", "loopback"),
    ("http://127.1/", "loopback"),
    ("http://2130706433/", "loopback"),
    ("http://0x7f000001/", "loopback"),
    ("http://[::1]:8080/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://[::]/", "unspecified"),
    ("http://10.0.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://[fc00::1]/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[fd00:ec2::254]/", "metadata"),
    ("http://[fe80::1%25eth0]/", "link-local"),
    ("http://224.0.0.1/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://100.64.0.1/", "public"),
    ("http://localhost:8000/", "this host"),
    ("http://LOCALHOST./", "this host"),
    ("http://app.localhost/", "this host"),
    ("http://metadata.google.internal/", "metadata"),
]


@pytest.mark.parametrize(("url", "says"), BAD_URLS)
def test_a_bad_or_forbidden_webhook_url_is_refused_with_what_to_change(url: str,
                                                                        says: str) -> None:
    with pytest.raises(WebhookRefused) as refused:
        check_url(url, allow_private=False)
    assert says.lower() in str(refused.value).lower()
    assert isinstance(refused.value, InvalidInput)  # the web answers 400


@pytest.mark.parametrize("raw", [None, 42, 1.5, True, ["http://example.com"],
                                 {"url": "http://example.com"}, b"http://example.com"])
def test_a_webhook_that_is_not_a_string_is_refused(raw: object) -> None:
    with pytest.raises(WebhookRefused, match="must be a string"):
        check_url(raw, allow_private=False)


@pytest.mark.parametrize("url", ["https://example.com/hook", "http://example.com:8080/h?a=b",
                                 "HTTPS://Example.COM/x", "https://93.184.215.14/",
                                 "https://[2606:4700::1111]/hook"])
def test_a_public_http_url_is_accepted_with_its_port_and_path(url: str) -> None:
    target = check_url(url, allow_private=False)
    assert target.scheme in ("http", "https") and target.path.startswith("/")
    assert target.port in (80, 443, 8080)


def test_allow_private_lets_loopback_through_but_never_metadata() -> None:
    assert check_url("http://127.0.0.1:9/", allow_private=True).port == 9
    assert check_url("http://localhost:9/", allow_private=True).host == "localhost"
    for url in ("http://169.254.169.254/", "http://[fd00:ec2::254]/",
                "http://metadata.google.internal/", "http://192.0.0.192/",
                "http://168.63.129.16/", "http://[::ffff:168.63.129.16]/"):
        with pytest.raises(WebhookRefused, match="metadata"):
            check_url(url, allow_private=True)


@pytest.mark.parametrize("address", ["169.254.1.1", "169.254.0.1", "fe80::1",
                                     "febf::1", "::ffff:169.254.7.7"])
def test_link_local_addresses_stay_refused_where_private_ones_are_allowed(
        address: str) -> None:
    assert "link-local" in str(address_refusal(ipaddress.ip_address(address), True))
    assert address_refusal(ipaddress.ip_address("10.1.2.3"), True) is None


@pytest.mark.parametrize(("address", "refused"), [
    ("8.8.8.8", False), ("2606:4700::1111", False), ("127.0.0.53", True), ("::1", True),
    ("10.1.2.3", True), ("169.254.1.1", True), ("::ffff:10.0.0.1", True),
    ("64:ff9b::7f00:1", True), ("2002:7f00:1::", True), ("ff02::1", True)])
def test_addresses_are_judged_after_resolution_as_literals_are(address: str,
                                                              refused: bool) -> None:
    assert (address_refusal(ipaddress.ip_address(address), False) is not None) is refused


@pytest.mark.parametrize(("raw", "says"), [
    ("done", "list"), ([], "list"), ({}, "list"), (["done", "finished"], "unknown event"),
    ([1], "unknown event"), ([None], "unknown event"), (["DONE"], "unknown event"),
    (["done"] * 6, "list"), ([["done"]], "unknown event")])
def test_bad_webhook_events_are_refused_naming_the_allowed_ones(raw: object, says: str) -> None:
    with pytest.raises(InvalidInput, match=says) as refused:
        check_events(raw)
    assert "running" in str(refused.value)


def test_events_default_to_the_terminal_ones_and_keep_a_fixed_order() -> None:
    assert check_events(None) == DEFAULT_EVENTS
    assert check_events(["done", "running", "done"]) == ("running", "done")


def test_webhook_events_without_a_webhook_are_refused() -> None:
    with pytest.raises(InvalidInput, match="needs a webhook"):
        webhook_option({"webhook_events": ["done"]}, allow_private=False)
    assert webhook_option({}, allow_private=False) == ""


def test_the_record_field_round_trips_and_is_found_at_the_admission_end() -> None:
    field = hook_field("https://example.com/h?a=1", ("running", "cancelled"))
    assert field == "rc https://example.com/h?a=1"
    assert HookField.decode(field) == HookField(("running", "cancelled"),
                                                "https://example.com/h?a=1")
    assert HookField.decode("") is None
    admission = "\t".join(["1", "", "", "5", "m", "b", "", "", ""]) + "\t" + field
    assert records.admission_hook(admission) == field
    assert records.admission_hook("\t".join(["1", "", "", "5", "m", "b", "", "", "", ""])) == ""
