"""A tiny stdlib HTTP client for the `carpool` command line (no extra dependency)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call(method: str, url: str, body: bytes | None = None,
         content_type: str = "application/json", timeout_s: float = 60.0) -> tuple[int, Any]:
    """(status, decoded JSON body) for one request; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 — our own URL
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, {"error": {"code": "http", "message": raw.decode(errors="replace")}}


def submit_json(base_url: str, model: str, job_input: Any) -> tuple[int, Any]:
    body = json.dumps({"model": model, "input": job_input}).encode()
    return call("POST", f"{base_url}/submit", body)


def result(base_url: str, job_id: str, wait_s: float) -> tuple[int, Any]:
    return call("GET", f"{base_url}/result/{job_id}?wait={wait_s:g}", timeout_s=wait_s + 30)
