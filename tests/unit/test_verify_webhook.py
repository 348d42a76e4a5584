"""Signed deliveries verify with ``standardwebhooks`` and ``carpool.client.verify_webhook``;
anything altered does not."""

from __future__ import annotations

import base64
import json
import time

import pytest
from standardwebhooks import Webhook

from carpool.client import WebhookInvalid, verify_webhook
from dispatcher.signing import delivery_headers

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
BODY = json.dumps({"id": "abc", "status": "done", "event": "done"})


def test_a_signed_delivery_verifies_with_both_helpers() -> None:
    headers = delivery_headers(SECRET, "abc.done", BODY, time.time())
    assert headers["webhook-id"] == "abc.done"
    assert Webhook(SECRET).verify(BODY, headers) == json.loads(BODY)
    assert verify_webhook(SECRET, BODY.encode(), headers)["status"] == "done"


@pytest.mark.parametrize("change", ["body", "id", "secret", "old", "no-signature", "garbled"])
def test_an_altered_delivery_does_not_verify(change: str) -> None:
    now = time.time() - (3600 if change == "old" else 0)
    headers = delivery_headers(SECRET, "abc.done", BODY, now)
    body, secret = BODY, SECRET
    if change == "body":
        body = BODY.replace("done", "failed")
    elif change == "id":
        headers["webhook-id"] = "abc.failed"
    elif change == "secret":
        secret = "whsec_" + base64.b64encode(b"x" * 32).decode()
    elif change == "no-signature":
        del headers["webhook-signature"]
    elif change == "garbled":
        headers["webhook-signature"] = "v1"  # no comma: the package's own split fails
    with pytest.raises(WebhookInvalid):
        verify_webhook(secret, body, headers)


def test_without_a_secret_a_delivery_carries_no_signature() -> None:
    assert "webhook-signature" not in delivery_headers("", "abc.done", BODY, time.time())
