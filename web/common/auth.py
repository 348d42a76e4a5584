"""Optional API keys: who may submit, and who may read or cancel a job.

With ``CARPOOL_API_KEYS`` (or ``CARPOOL_API_KEYS_FILE``) set, every submit and
result call needs a key (``Authorization: Bearer <key>`` or ``X-API-Key``). Each
job records its submitter's key digest as its ``owner``, and only that key reads
or cancels it: any other key gets the same 404 as an unknown id, so a job's
existence does not leak. Without keys, ids (128 random bits) are the only secret.
"""

from __future__ import annotations

from flask import Request

from carpool.admission.tiers import DEFAULT_TIER, SERVICE_TIER_HEADER, request_tier
from carpool.core.jobs import JobView
from carpool.core.settings import Settings, api_key_digest
from web.common.refusals import JobNotFound, Unauthorized

#: The header a client may use instead of ``Authorization: Bearer``.
API_KEY_HEADER = "X-API-Key"


def _presented_key(req: Request) -> str | None:
    auth = req.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return req.headers.get(API_KEY_HEADER) or None


def request_owner(settings: Settings, req: Request) -> str:
    """The owner digest this request acts as; "" when the server has no keys."""
    if not settings.api_key_digests:
        return ""
    key = _presented_key(req)
    if key is None:
        raise Unauthorized("this server needs an API key: send 'Authorization: Bearer <key>'")
    digest = api_key_digest(key)  # compared as digests: no timing leak of the key itself
    if digest not in settings.api_key_digests:
        raise Unauthorized("this API key is not known to the server")
    return digest


def check_owner(view: JobView | None, owner: str, job_id: str) -> JobView:
    """``view`` if ``owner`` may see it; else the 404 an unknown id gets."""
    if view is None or (owner and view.owner != owner):
        raise JobNotFound(f"no job {job_id}: never submitted, or its result has expired")
    return view


def service_tier(settings: Settings, owner: str, req: Request, asked: str = "") -> str:
    """The tier a request runs in: its key's (the keys file; default ``default``), or
    the lower one it asks for in ``asked`` (a body's ``service_tier``) or the
    ``X-Service-Tier`` header; a higher or unknown one is a 400."""
    policy = settings.api_key_policies.get(owner)
    return request_tier(asked or req.headers.get(SERVICE_TIER_HEADER, ""),
                        policy.tier if policy else DEFAULT_TIER)
