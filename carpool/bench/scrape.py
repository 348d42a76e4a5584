"""The web tier's own answer times, read from its ``/metrics`` around a step.

The client-side latency of a refusal includes the generator's own lag (it starts
jobs late when it shares a busy machine with the stack). The web times every
request it answers in ``carpool_http_request_duration_seconds`` (from Flask's
first hook to its last: the time in gunicorn's accept queue is not in it), so
the difference of that histogram before and after a step says how long the
server itself took over the step's 429s, to the resolution of its buckets.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

DURATION = "carpool_http_request_duration_seconds"
#: A scrape of a busy web tier can wait behind the step's own requests.
SCRAPE_TIMEOUT_S = 10.0

#: Cumulative bucket counts by upper bound (seconds; math.inf for "+Inf").
Buckets = dict[float, float]


def parse_buckets(text: str, route: str, method: str, status: str) -> Buckets:
    """The duration histogram's buckets for one route, method and status (summed
    over processes: under gunicorn a scrape already is the sum)."""
    return parse_histogram(text, DURATION, {"route": route, "method": method,
                                            "status": status})


def parse_histogram(text: str, name: str, labels: Mapping[str, str] | None = None) -> Buckets:
    """Histogram ``name``'s buckets, summed over the series that carry ``labels``."""
    wanted = dict(labels or {})
    out: Buckets = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == name + "_bucket" and all(
                    sample.labels.get(k) == v for k, v in wanted.items()):
                bound = float(sample.labels["le"])
                out[bound] = out.get(bound, 0.0) + sample.value
    return out


def fetch_buckets(base_url: str, route: str = "/submit", method: str = "POST",
                  status: str = "429") -> Buckets | None:
    """None when the web does not answer the scrape (a stack of someone else's
    with /metrics closed, say): the step's figures stand without it."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics",
                                    timeout=SCRAPE_TIMEOUT_S) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return parse_buckets(text, route, method, status)


def quantile_bound(before: Mapping[float, float], after: Mapping[float, float],
                   q: float) -> tuple[float, int]:
    """The smallest bucket bound (seconds) holding the ``q`` quantile (0–1) of the
    requests counted between two scrapes, and how many there were; NaN when none."""
    deltas = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return math.nan, 0
    need = math.ceil(q * total - 1e-9)  # 0.99 × 100 is 99, not 99.00000000000001
    for bound, count in deltas:
        if count >= need:
            return bound, round(total)
    return math.inf, round(total)


def quantile_estimate(before: Mapping[float, float], after: Mapping[float, float],
                      q: float) -> float:
    """The ``q`` quantile (0–1, seconds) interpolated linearly within its bucket, as
    Prometheus's ``histogram_quantile`` does: an estimate that assumes the bucket's
    requests spread evenly over it; NaN when none, the last finite bound past it."""
    deltas = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in deltas:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower
