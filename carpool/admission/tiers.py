"""Service tiers: ``tier=priority|default|flex`` per API key (the keys file), and the
lower tier a request may ask for (``service_tier``), never a higher one.

In a surge flex is refused first and priority last: a tier's jobs are admitted up to
its share of the bin's bound (``max_depth``) and of the wait a job is allowed
(deadline or ``max_queue_ms``), so the rest stays free for the tiers above it
(admit.lua). Default keeps ``DEFAULT_SHARE_WITH_PRIORITY`` only where some key is a
priority key: without one, nothing is reserved and default admits as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from carpool.core.errors import InvalidInput

#: Lowest first.
TIERS: Final = ("flex", "default", "priority")
DEFAULT_TIER: Final = "default"
FLEX_SHARE: Final = 0.5
DEFAULT_SHARE_WITH_PRIORITY: Final = 0.8


def tier_shares(priority_keys: bool) -> Mapping[str, float]:
    """Each tier's share of a bin's bound and of a job's allowed wait."""
    return {"flex": FLEX_SHARE,
            "default": DEFAULT_SHARE_WITH_PRIORITY if priority_keys else 1.0,
            "priority": 1.0}


#: What a request may ask for besides a tier: its key's (OpenAI's default value).
AUTO: Final = "auto"
#: The header that asks for a lower tier where the body has no ``service_tier`` field.
SERVICE_TIER_HEADER: Final = "X-Service-Tier"


def known_tier(asked: object) -> str:
    """``asked`` if it names a tier or ``auto``; else InvalidInput (400) listing them."""
    if not isinstance(asked, str) or (asked not in TIERS and asked != AUTO):
        raise InvalidInput(f"service_tier must be one of {', '.join(TIERS)} or {AUTO}, "
                           f"not {str(asked)[:40]!r}")
    return asked


def request_tier(asked: str, key_tier: str) -> str:
    """The tier a request runs in: its key's, or the lower one it asked for ("" or
    ``auto``: none)."""
    if not asked or known_tier(asked) == AUTO:
        return key_tier
    if TIERS.index(known_tier(asked)) > TIERS.index(key_tier):
        raise InvalidInput(f"service_tier {asked!r} is above this API key's tier "
                           f"{key_tier!r}; ask for {key_tier!r} or a lower one")
    return asked
