"""What the webhook end-to-end tests share: secrets, settings, submitting with a webhook,
and reading what arrived."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx

from carpool.backend.outbox import Outbox
from carpool.core.shards import shard
from tests.support.receiver import Received

DEPLOY_SECRET = "whsec_" + base64.b64encode(b"d" * 32).decode()
KEY_SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
KEY_OWN = "own-secret-key-" + "a" * 16  # has a webhook_secret of its own
KEY_SHARED = "shared-secret-key-" + "b" * 16  # signed with the deployment's
API_KEYS = f"{KEY_OWN} webhook_secret={KEY_SECRET},{KEY_SHARED}"
SYNTHETIC = shard("synthetic")


def hook_env(**extra: str) -> dict[str, str]:
    """Webhook settings for a test: loopback receivers allowed, short retries."""
    return {"CARPOOL_WEBHOOK_SECRET": DEPLOY_SECRET, "CARPOOL_API_KEYS": API_KEYS,
            "CARPOOL_WEBHOOK_ALLOW_PRIVATE": "1", "CARPOOL_WEBHOOK_RETRY_BASE_S": "0.2",
            "CARPOOL_WEBHOOK_RETRY_MAX_S": "1", "CARPOOL_WEBHOOK_CONNECT_TIMEOUT_S": "1",
            "CARPOOL_WEBHOOK_READ_TIMEOUT_S": "2", "CARPOOL_MODELS": "synthetic", **extra}


def submit(base_url: str, key: str, webhook: str, n: int = 1,
           events: list[str] | None = None) -> list[str]:
    """``n`` synthetic jobs with ``webhook``, as one batch (one /submit when n is 1)."""
    body: dict[str, Any] = {"model": "synthetic", "webhook": webhook}
    if events is not None:
        body["webhook_events"] = events
    auth = {"Authorization": f"Bearer {key}"}
    if n == 1:
        resp = httpx.post(f"{base_url}/submit", headers=auth, timeout=10,
                          json={**body, "input": {"value": 0, "size": 1}})
        assert resp.status_code == 202, resp.text
        return [str(resp.json()["id"])]
    resp = httpx.post(f"{base_url}/submit/batch", headers=auth, timeout=10,
                      json={**body, "inputs": [{"value": i, "size": 1} for i in range(n)]})
    assert resp.status_code == 202, resp.text
    return [str(j["id"]) for j in resp.json()["jobs"]]


def document(base_url: str, key: str, job_id: str) -> dict[str, Any]:
    resp = httpx.get(f"{base_url}/result/{job_id}", headers={"Authorization": f"Bearer {key}"},
                     timeout=10)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def body_of(r: Received) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(r.body)
    return doc


def outbox_empty(outbox: Outbox) -> bool:
    return outbox.waiting([SYNTHETIC]) == 0
