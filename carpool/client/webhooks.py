"""The receiver's side of carpool's webhooks: check a delivery's signature.

    from carpool.client import verify_webhook

    job = verify_webhook(secret, request.get_data(), request.headers)  # raises if forged

A thin layer over the ``standardwebhooks`` package, so a receiver in another language
uses that package's port with the same secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from carpool.core.errors import CarpoolError


class WebhookInvalid(CarpoolError):
    """Raised when a webhook's signature, timestamp or body does not verify."""


def verify_webhook(secret: str, body: bytes | str, headers: Mapping[str, str]) -> dict[str, Any]:
    """The job document a delivery carries, once its ``webhook-signature`` verifies
    against ``secret`` (whsec_...) and its ``webhook-timestamp`` is within five
    minutes of now; raises ``WebhookInvalid`` otherwise. Drop a repeated
    ``headers["webhook-id"]``: a delivery may come more than once."""
    try:
        doc = Webhook(secret).verify(body, {str(k): str(v) for k, v in headers.items()})
    except WebhookVerificationError as exc:
        raise WebhookInvalid(f"webhook does not verify: {exc}") from None
    except (ValueError, TypeError, UnicodeDecodeError) as exc:  # a malformed header or body
        raise WebhookInvalid(f"webhook does not verify: malformed ({exc})") from None
    if not isinstance(doc, dict):
        raise WebhookInvalid("webhook body is not a JSON object")
    return doc
