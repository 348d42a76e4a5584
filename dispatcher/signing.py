"""The headers of one delivery, signed with the ``standardwebhooks`` package."""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks import Webhook

#: What the dispatcher says it is (receivers' logs).
USER_AGENT = "carpool-webhooks/1"


def delivery_headers(secret: str, webhook_id: str, body: str, now_s: float) -> dict[str, str]:
    """Standard Webhooks' ``webhook-id``, ``webhook-timestamp`` (this try's, in seconds)
    and ``webhook-signature`` (v1, HMAC-SHA256 of "id.timestamp.body"); no signature
    without a secret."""
    when = datetime.fromtimestamp(int(now_s), tz=UTC)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               "webhook-id": webhook_id, "webhook-timestamp": str(int(now_s))}
    if secret:
        headers["webhook-signature"] = Webhook(secret).sign(webhook_id, when, body)
    return headers
