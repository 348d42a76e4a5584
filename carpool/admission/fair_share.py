"""Fair share between owners (API keys) of one bin: when an owner over its share is
refused near the bound, and how far ahead its virtual clock may run (fair queueing,
docs/admission.md). admit.lua applies both; these are the numbers it is given."""

from __future__ import annotations

#: Fair share starts refusing an owner over its share at this part of a bin's bound
#: (max_depth, or the predicted-wait limit): the rest is kept for owners under theirs.
FAIR_SHARE_NEAR = 0.8
#: Fair queueing: an owner's virtual clock leads now by at most this many times the
#: bin's max_queue_ms, so a tenant that flooded while the bin had room is not held
#: back for long once others return; its queued jobs wait about max_queue_ms, so
#: twice that keeps every one of them behind a quiet tenant's new job.
FAIR_LEAD_QUEUE_FACTOR = 2
#: ... and at most this long where the bin has no max_queue_ms (0: depth alone).
FAIR_LEAD_MAX_MS = 60_000


def fair_lead_cap_ms(max_queue_ms: int) -> int:
    """The most an owner's virtual clock may lead now in a bin with ``max_queue_ms``."""
    return FAIR_LEAD_QUEUE_FACTOR * max_queue_ms if max_queue_ms > 0 else FAIR_LEAD_MAX_MS
