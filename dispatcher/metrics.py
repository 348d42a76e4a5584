"""The dispatcher's Prometheus metrics (docs/reference.md lists them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

#: The outcomes a try is counted under.
OUTCOMES = ("delivered", "retried", "dead", "refused")
#: Delivery latency buckets (s): the goal is under a second; retries take hours.
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0,
                     3600.0, 86400.0)


class DispatchMetrics:
    """Counts each try by outcome; times each delivery from the job's state change."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.deliveries = Counter(
            "carpool_webhook_deliveries", "Webhook tries, by outcome: delivered (2xx), "
            "retried (a failure to be tried again), dead (dead-lettered), refused (the "
            "target's address is not allowed)", ["outcome"], registry=self.registry)
        self.latency = Histogram(
            "carpool_webhook_delivery_latency_seconds", "From the job's state change "
            "(Redis's clock) to the receiver's 2xx", buckets=LATENCY_BUCKETS_S,
            registry=self.registry)
        for outcome in OUTCOMES:
            self.deliveries.labels(outcome)

    def serve(self, port: int, addr: str) -> None:
        if port:
            start_http_server(port, addr, registry=self.registry)
