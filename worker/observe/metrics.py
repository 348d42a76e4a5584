"""A worker's Prometheus metrics: fed by the batch loop, served on its own port.

Counted here, each event once, by the worker that saw it (the web counts
submissions and rejections; ``README.md`` maps every name to Triton's):

- ``completed`` / ``failed``: per job whose result this worker wrote. A result
  refused because the lease was lost is counted by whoever did write it.
- ``expired``: per job that ``claim.lua`` found past or too near its deadline.
- items inferred, batch executions, batch size: per batch run.
- queue wait and end-to-end seconds: one observation per written job;
  preprocess and inference seconds: one per completed job (its batch's times,
  as its result reports them). End to end is Redis's admission-to-claim time
  plus this worker's claim-to-written time.

Usage per API key (docs/admission.md, "Usage"): jobs written, their device and queue
seconds, labelled ``model, key`` (the key's digest's first hex digits); the first
``USAGE_METRIC_KEYS`` keys a worker sees get a label of their own, the rest ``other``,
so the series stay bounded however many keys there are.

Read at scrape time: each bin's live batch limit, the executor's counters
(``ExecutorStats``: padding waste per bin, batches split after a failure), and
GPU memory (absent on the CPU). Methods for other parts of the worker:
``record_shrink`` (the memory guard halved a bin's limit), ``record_reclaimed``
(expired leases taken back), and the ``gpu_memory`` reader.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from carpool.backend.usage import key_label
from carpool.core.errors import ConfigError
from carpool.core.jobs import Claim
from carpool.core.settings import DEFAULT_WORKER_METRICS_ADDR
from carpool.scheduling.batching import Limits
from worker.executors.base import ExecutorStats
from worker.handlers.base import ModelHandler
from worker.loop.observers import BatchReport, Observer

log = logging.getLogger(__name__)

#: Queue wait and end to end: batching waits are milliseconds, backlogs minutes.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0, 60.0, 120.0, 300.0)
#: Preprocess and inference of one batch.
COMPUTE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0, 30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BIN_LABELS = ("model", "bin")
#: API keys with usage series of their own, per worker; later keys count as "other".
USAGE_METRIC_KEYS = 50


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory: device-wide used and free, and this process's reserved cache."""

    gpu: str  # "GPU-<uuid>", as nvidia-smi names it
    used_bytes: int
    reserved_bytes: int
    free_bytes: int


GpuMemoryReader = Callable[[], Sequence[GpuMemory]]


def torch_gpu_memory(device: int | None = None) -> list[GpuMemory]:
    """What torch.cuda says of one device, the executor's (``device``; None: the current
    one); nothing until this process has initialised CUDA. Only that one: a
    ``mem_get_info`` on any other visible GPU would create a CUDA context there (some
    hundreds of MiB of that GPU's memory, held by this process) at the first scrape."""
    torch = sys.modules.get("torch")  # never imported here: a synthetic-only worker has none
    if torch is None or not torch.cuda.is_initialized():
        return []
    i = torch.cuda.current_device() if device is None else device
    free, total = torch.cuda.mem_get_info(i)
    uuid = torch.cuda.get_device_properties(i).uuid
    return [GpuMemory(f"GPU-{uuid}", int(total - free), int(torch.cuda.memory_reserved(i)),
                      int(free))]


class _ScrapeTimeGauges(Collector):
    """Read when scraped: batch limits, the executor's counters, GPU memory."""

    def __init__(self, limits: Callable[[], Mapping[tuple[str, str], Limits]],
                 stats: ExecutorStats, gpu_memory: GpuMemoryReader) -> None:
        self._limits = limits
        self._stats = stats
        self._gpu_memory = gpu_memory

    def collect(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily("carpool_batch_limit",
                                  "Most jobs a batch of this bin may hold now (memory guard).",
                                  labels=BIN_LABELS)
        for (model, bin_name), lim in sorted(dict(self._limits()).items()):
            limit.add_metric([model, bin_name], lim.max_batch)
        yield limit
        # Only bins whose handler tells item sizes, once a batch was collated.
        padding = GaugeMetricFamily(
            "carpool_padding_waste_ratio",
            "Share of a padded batch that is padding (moving average over batches).",
            labels=BIN_LABELS)
        for (model, bin_name), ratio in sorted(dict(self._stats.padding_waste).items()):
            padding.add_metric([model, bin_name], ratio)
        yield padding
        splits = CounterMetricFamily(
            "carpool_batch_splits",
            "Failed (sub-)batches split in halves and retried, by cause.", labels=["cause"])
        splits.add_metric(["out_of_memory"], self._stats.oom_splits)
        splits.add_metric(["error"], self._stats.error_splits)
        yield splits
        try:
            gpus = self._gpu_memory()
        except Exception:  # noqa: BLE001 — a failed reading drops the gauges, not the scrape
            log.exception("reading GPU memory failed")
            return
        if not gpus:
            return  # on the CPU these gauges are absent, not zero
        for name, text, field in (
            ("carpool_gpu_memory_used_bytes", "GPU memory in use, device-wide.", "used_bytes"),
            ("carpool_gpu_memory_reserved_bytes",
             "GPU memory held by this worker's caching allocator.", "reserved_bytes"),
            ("carpool_gpu_memory_free_bytes", "GPU memory free, device-wide.", "free_bytes"),
        ):
            family = GaugeMetricFamily(name, text, labels=["gpu"])
            for g in gpus:
                family.add_metric([g.gpu], getattr(g, field))
            yield family


class WorkerMetrics(Observer):
    """One worker's metrics, in its own registry; an observer of ``BatchLoop``."""

    def __init__(self, handlers: Mapping[str, ModelHandler],
                 limits: Callable[[], Mapping[tuple[str, str], Limits]],
                 stats: ExecutorStats | None = None,
                 gpu_memory: GpuMemoryReader = torch_gpu_memory) -> None:
        self.handlers = handlers
        self.registry = CollectorRegistry()
        r = self.registry

        def counter(name: str, text: str) -> Counter:
            return Counter(name, text, BIN_LABELS, registry=r)

        def histogram(name: str, text: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, text, BIN_LABELS, buckets=buckets, registry=r)

        self.completed = counter("carpool_jobs_completed_total", "Jobs that ended done.")
        self.failed = counter("carpool_jobs_failed_total", "Jobs that ended failed.")
        self.expired = counter("carpool_jobs_expired_total",
                               "Jobs a claim found past their deadline or too near it "
                               "for their batch, never run.")
        self.items = counter("carpool_items_inferred_total", "Items run through a model.")
        self.batches = counter("carpool_batch_executions_total", "Batches run.")
        self.shrinks = counter("carpool_batch_limit_shrinks_total",
                               "Times the memory guard halved a bin's batch limit.")
        self.batch_size = histogram("carpool_batch_size", "Jobs per batch run.",
                                    BATCH_SIZE_BUCKETS)
        self.queue_wait = histogram("carpool_queue_wait_seconds",
                                    "Admission to claim, per job (Redis clock).",
                                    LATENCY_BUCKETS_S)
        self.preprocess = histogram("carpool_preprocess_seconds",
                                    "Preprocessing of a completed job's batch.",
                                    COMPUTE_BUCKETS_S)
        self.inference = histogram("carpool_inference_seconds",
                                   "Collate, forward and postprocess of a completed job's batch.",
                                   COMPUTE_BUCKETS_S)
        self.latency = histogram("carpool_job_latency_seconds",
                                 "Admission to result written, per job.", LATENCY_BUCKETS_S)
        self.reclaimed = Counter("carpool_leases_reclaimed_total",
                                 "Job leases taken back from workers that stopped renewing.",
                                 registry=r)
        usage_labels = ("model", "key")
        self.usage_jobs = Counter("carpool_usage_jobs_total", "Jobs written, per API key.",
                                  usage_labels, registry=r)
        self.usage_device = Counter("carpool_usage_device_seconds_total",
                                    "Device time of the jobs written: each one's share of "
                                    "its batch's forward time.", usage_labels, registry=r)
        self.usage_queue = Counter("carpool_usage_queue_seconds_total",
                                   "Admission to claim of the jobs written.", usage_labels,
                                   registry=r)
        self._usage_keys: set[str] = set()
        r.register(_ScrapeTimeGauges(limits, stats or ExecutorStats(), gpu_memory))
        for handler in handlers.values():  # every series exists from the start, at zero
            for b in handler.spec.bins:
                for metric in (self.completed, self.failed, self.expired, self.items,
                               self.batches, self.shrinks, self.batch_size, self.queue_wait,
                               self.preprocess, self.inference, self.latency):
                    metric.labels(handler.spec.name, b.name)

    def on_expired(self, claim: Claim) -> None:
        self.expired.labels(claim.model, claim.bin).inc(claim.expired)

    def on_finished(self, claim: Claim, report: BatchReport) -> None:
        key = (report.model, report.bin)
        self.batches.labels(*key).inc()
        self.items.labels(*key).inc(report.size)
        self.batch_size.labels(*key).observe(report.size)
        for job, outcome, written in zip(claim.jobs, report.outcomes, report.written,
                                         strict=False):
            if not written:
                continue
            queue_s = (claim.now_ms - job.admit_ms) / 1000.0
            self.queue_wait.labels(*key).observe(queue_s)
            who = self._usage_label(job.owner)
            self.usage_jobs.labels(report.model, who).inc()
            self.usage_device.labels(report.model, who).inc(outcome.device_ms / 1000.0)
            self.usage_queue.labels(report.model, who).inc(queue_s)
            self.latency.labels(*key).observe(queue_s + report.runtime_s)
            if outcome.failed:
                self.failed.labels(*key).inc()
                continue
            self.completed.labels(*key).inc()
            self.preprocess.labels(*key).observe(outcome.preprocess_ms / 1000.0)
            self.inference.labels(*key).observe(outcome.inference_ms / 1000.0)

    def _usage_label(self, owner: str) -> str:
        label = key_label(owner)
        if label in self._usage_keys or len(self._usage_keys) < USAGE_METRIC_KEYS:
            self._usage_keys.add(label)
            return label
        return "other"

    def record_shrink(self, model: str, bin_name: str) -> None:
        """The memory guard halved this bin's batch limit (``MemoryGuard.on_shrink``)."""
        self.shrinks.labels(model, bin_name).inc()

    def record_reclaimed(self, n: int = 1) -> None:
        """``n`` expired job leases were taken back (the lease reaper calls this)."""
        self.reclaimed.inc(n)

    def serve(self, port: int, addr: str = DEFAULT_WORKER_METRICS_ADDR) -> MetricsServer:
        """Serve ``/metrics`` on ``addr:port`` in a daemon thread; ConfigError if taken."""
        try:
            server, thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"CARPOOL_WORKER_METRICS_PORT={port}: cannot listen ({exc}); give each worker "
                "on a host its own port, or 0 to turn the endpoint off") from exc
        log.info("worker metrics on http://%s:%d/metrics", addr, port)
        return MetricsServer(server, thread)


@dataclass(frozen=True)
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
