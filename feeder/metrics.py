"""The feeder's Prometheus metrics (docs/reference.md lists them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

#: How a stored line ended: an answer (``done``), or an error line (``failed``).
LINE_OUTCOMES = ("done", "failed")
#: The final statuses a batch can end in (OpenAI's).
FINAL_STATUSES = ("completed", "failed", "expired", "cancelled")
#: Step duration buckets (s): an idle step is milliseconds; a big collect or a
#: finalize that assembles a large output file takes seconds.
STEP_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  30.0)


class FeederMetrics:
    """Counts admitted and stored lines and ended batches; times each step."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.admitted = Counter(
            "carpool_feeder_lines_admitted", "Batch lines admitted into their model's "
            "bins (again after their jobs were lost)", registry=self.registry)
        self.stored = Counter(
            "carpool_feeder_lines_stored", "Batch lines appended to the file store, by "
            "outcome: done (an answer) or failed (an error line)", ["outcome"],
            registry=self.registry)
        self.ended = Counter(
            "carpool_feeder_batches_ended", "Batches moved to a final status by this "
            "feeder", ["status"], registry=self.registry)
        self.running = Gauge(
            "carpool_feeder_batches_running", "Batches the feeder holds now (in_progress "
            "or cancelling)", registry=self.registry)
        self.step_seconds = Histogram(
            "carpool_feeder_step_seconds", "One step over every active batch",
            buckets=STEP_BUCKETS_S, registry=self.registry)
        for outcome in LINE_OUTCOMES:
            self.stored.labels(outcome)
        for status in FINAL_STATUSES:
            self.ended.labels(status)

    def serve(self, port: int, addr: str) -> None:
        if port:
            start_http_server(port, addr, registry=self.registry)
