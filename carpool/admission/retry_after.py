"""How long a client refused with 429 should wait: the bin's depth over its drain rate.

complete.lua keeps each bin's drain rate as a decayed count (``rate_c``, time
constant ``DRAIN_TAU_MS``) and the time of its first drain; admit.lua, refusing
a job, returns both decayed to now, in the same round trip. A full bin of depth
``d`` that drains ``r`` jobs/s needs ``d / r`` seconds to serve what is queued:
a client that comes back sooner only meets a full bin again. When nothing has
drained for a while the rate decays toward zero and the answer grows to its cap:
honest, because no worker is serving that bin.
"""

from __future__ import annotations

from carpool.scheduling.rates import decayed_rate_per_ms

#: The drain rate averages about the last 10 s: steady, yet it follows a worker loss.
DRAIN_TAU_MS = 10_000
#: One batch right after start-up reads as a rate over at least this long.
DRAIN_MIN_AGE_MS = 1_000
#: Admission by predicted wait trusts a drain rate only while the bin drained within
#: this long; after that (workers gone, scale from zero) the depth bound alone holds,
#: so a bin that no worker serves yet still queues up to max_depth.
DRAIN_STALE_MS = 3 * DRAIN_TAU_MS
#: Retry-After is whole seconds (RFC 9110), at least 1 ...
RETRY_AFTER_MIN_S = 1.0
#: ... and at most this, also when no worker drains the bin at all.
RETRY_AFTER_MAX_S = 300.0


def drain_rate_per_s(decayed_count: float, age_ms: int) -> float:
    """Jobs/s drained from a bin, from admit.lua's reply (age < 0: never drained)."""
    per_ms = decayed_rate_per_ms(decayed_count, age_ms, DRAIN_TAU_MS, DRAIN_MIN_AGE_MS)
    return per_ms * 1000.0


def retry_after_s(depth: int, rate_per_s: float) -> float:
    """Seconds until ``depth`` queued jobs drain at ``rate_per_s``, within the bounds."""
    if rate_per_s <= 0:
        return RETRY_AFTER_MAX_S
    return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, depth / rate_per_s))


def share_retry_after_s(excess: float, rate_per_s: float) -> float:
    """Seconds until an owner ``excess`` jobs over its share is back within it: its
    excess drains at the bin's rate. With a drain rate the excess is its virtual
    clock's lead over the bin's bound, so this is exact in the clock's terms; without
    one it is of recent admissions (an estimate: that count decays as well)."""
    if rate_per_s <= 0:  # no drain measured: its count falls by e-fold in DRAIN_TAU_MS
        return min(RETRY_AFTER_MAX_S, DRAIN_TAU_MS / 1000)
    return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, excess / rate_per_s))


def late_retry_after_s(ahead: int, rate_per_s: float, limit_ms: int) -> float:
    """Seconds until a job refused for its predicted wait would fit its limit again:
    the wait predicted for the ``ahead`` jobs, less the wait it may have."""
    if rate_per_s <= 0:
        return RETRY_AFTER_MAX_S
    excess_s = ahead / rate_per_s - limit_ms / 1000.0
    return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, excess_s))
