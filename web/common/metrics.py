"""The web tier's Prometheus metrics, served at ``GET /metrics``.

Counted here, once per job (workers count what happens after; ``README.md``
maps every name to Triton's):

- ``carpool_jobs_submitted_total{model,bin}``: each job newly queued (a 202). A
  repeated idempotency key queues nothing and counts nothing.
- ``carpool_jobs_rejected_total{model,reason}``: each job refused, by a closed
  set of reasons (``REASONS``, web/common/refusals.py); a ``/submit/batch`` item refused
  alone counts once, a request refused as a whole before its items were read counts once.
  ``model`` is "" when the request named no model of the catalogue: a label
  never takes a value a client made up.
- ``carpool_jobs_abandoned_total{model}``: each job cancelled while queued because
  its synchronous caller hung up (web/common/sync_wait.py): never computed.
- ``carpool_http_requests_total{route,method,status}`` and
  ``carpool_http_request_duration_seconds{route,method,status}``: every HTTP
  request, by its route's pattern (``/result/<job_id>``, never the id; "unmatched"
  for a path no route has) — a long-poll's time includes its wait.
- ``carpool_web_shed_total{reason}``: each admitting request answered 503
  ``overloaded`` before it ran (web/common/shedding.py); it counts nowhere else.
- ``carpool_web_refusal_seconds``: for each admitting request refused (429 or 503, shed
  or not, before any of its jobs was admitted), how long its caller waited at the web:
  from its bytes reaching this host (the accept queue included) to the answer.

Under gunicorn each worker process counts into its own files in
``PROMETHEUS_MULTIPROC_DIR`` (``web/gunicorn_conf.py`` sets it) and any process
answers a scrape with the sum over all of them. Bin depth and the oldest job's
age are read from Redis when scraped, in one script call, so every process
(and every replica) reports the same values: read them with ``max by``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from flask import Flask, Request, Response, g, request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from carpool.backend.queue import Queue
from carpool.core.catalogue import Catalogue
from carpool.core.errors import BackendUnavailable, CarpoolError, ConfigError, UnknownModel
from carpool.core.jobs import Admitted
from web.common.refusals import (
    HTTP_OTHER_REASON,
    HTTP_TOO_LARGE_REASON,
    INTERNAL,
    REASONS,
    Unauthorized,
    refusal_of,
)
from web.common.shedding import ADMITTED_ENVIRON, SHED_REASONS

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
BIN_LABELS = ("model", "bin")
HTTP_LABELS = ("route", "method", "status")
#: Methods a label may name; any other (a client may send any token) counts as "other".
HTTP_METHODS = frozenset({"GET", "POST", "DELETE", "HEAD", "OPTIONS", "PUT", "PATCH"})
#: Request durations: a submit takes about a millisecond, a long-poll up to a minute.
HTTP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                  10.0, 30.0, 60.0)
#: A refusal's wait at the web: milliseconds for a bad request, seconds once the web's
#: own CPU is saturated and requests wait in its accept queue (docs/benchmarks.md).
REFUSAL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def rejection_reason(exc: Exception) -> str:
    """The ``reason`` label for ``exc`` (web/common/refusals.py's table)."""
    if isinstance(exc, CarpoolError):
        return refusal_of(exc).reason
    if isinstance(exc, HTTPException):  # werkzeug's own 4xx, e.g. a malformed multipart body
        return (HTTP_TOO_LARGE_REASON if isinstance(exc, RequestEntityTooLarge)
                else HTTP_OTHER_REASON)
    return INTERNAL.reason


#: The routes whose refusals count as rejected jobs (``count_refused_request``).
SUBMIT_ENDPOINTS = frozenset({"carpool.submit", "carpool.submit_many", "v2.infer",
                              "v1_batches.embeddings"})


def remember_model(doc: object) -> None:
    """Note the model a parsed JSON body names, for ``requested_model`` to label with."""
    if isinstance(doc, dict):
        g.carpool_model = doc.get("model")


def body_read() -> None:
    """Note that the request's body was read within its limits: only then may
    ``requested_model`` look at a form."""
    g.carpool_body_read = True


def jobs_admitted(req: Request) -> None:
    """The request's jobs are admitted (or refused one by one in its answer): an error
    after this point, while waiting for results, refuses no job."""
    req.environ[ADMITTED_ENVIRON] = True


def refusing_jobs(n: int) -> None:
    """The refusal about to be raised refuses ``n`` jobs (a batch's), not one."""
    g.carpool_refused_jobs = n


def requested_model(catalogue: Catalogue, exc: Exception, req: Request) -> str:
    """The catalogue model that a refused request named, or "".

    Never parses the body again: a JSON body's model is what ``remember_model`` saw
    (nothing when it was refused before or while parsing), a form's is the form
    werkzeug already parsed, a raw image's is ``?model=``.
    """
    if isinstance(exc, UnknownModel | RequestEntityTooLarge) or not g.get("carpool_body_read"):
        return ""
    name: object = req.args.get("model")
    if req.mimetype == "application/json":
        name = g.get("carpool_model")
    elif req.mimetype == "multipart/form-data":
        try:
            name = req.form.get("model")
        except HTTPException:  # a malformed form: no model to name
            return ""
    if not isinstance(name, str):
        return ""
    try:
        return catalogue.get(name).name  # "m@1" counts under "m" when m's entry is 1
    except UnknownModel:
        return ""


class BinGauges(Collector):
    """Depth and oldest job's age of every bin, read from Redis when scraped.

    A bin is sorted by urgency, not age (carpool.admission.urgency), so the peek looks at every
    job of a bin holding fewer than ``max_batch`` (``scan``); a fuller bin only at its
    head, its most urgent job: its oldest too unless deadlines or priorities put a
    younger job first. A scrape thus costs O(sum of max_batch), never O(depth).
    """

    def __init__(self, queue: Queue, bins: Sequence[tuple[str, str]],
                 scan: Sequence[int]) -> None:
        self._queue = queue
        self._bins = list(bins)
        self._scan = list(scan)

    def collect(self) -> Iterator[Metric]:
        try:
            now_ms, states = self._queue.peek(self._bins, self._scan)
        except BackendUnavailable as exc:
            log.warning("bin gauges left out of this scrape: %s", exc)
            return
        depth = GaugeMetricFamily("carpool_bin_depth", "Jobs queued in the bin.",
                                  labels=BIN_LABELS)
        age = GaugeMetricFamily("carpool_bin_oldest_age_seconds",
                                "Age of the bin's oldest queued job (0 when empty; in a "
                                "bin of max_batch or more, of its most urgent job).",
                                labels=BIN_LABELS)
        for s in states:
            depth.add_metric([s.model, s.bin], s.depth)
            oldest_ms = now_ms if s.oldest_admit_ms is None else s.oldest_admit_ms
            age.add_metric([s.model, s.bin], max(0, now_ms - oldest_ms) / 1000.0)
        yield depth
        yield age


class RedisCollectors(Collector):
    """The collectors that read Redis at a scrape, behind one ``ping``: a Redis that does
    not answer costs the scrape one socket timeout, not one per collector (three waits
    of 5 s outlast Prometheus's 10 s scrape timeout, and every series of the web with
    them). Each collector still leaves itself out when Redis fails it after the ping."""

    def __init__(self, ping: Callable[[], None]) -> None:
        self._ping = ping
        self.collectors: list[Collector] = []

    def collect(self) -> Iterator[Metric]:
        try:
            self._ping()
        except BackendUnavailable as exc:
            log.warning("the gauges read from Redis are left out of this scrape: %s", exc)
            return
        for collector in self.collectors:
            yield from collector.collect()


class WebMetrics:
    """The counters of one web process and the registry that a scrape renders."""

    def __init__(self, queue: Queue, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self.registry = CollectorRegistry()
        multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        if multiprocess:
            if prometheus_values.ValueClass is prometheus_values.MutexValue:
                raise ConfigError(f"{MULTIPROC_ENV} was set after prometheus_client was "
                                  "imported: this process's counts would never be shared")
            # Sums every process's files. prometheus_client leaves this one untyped.
            MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
        own = None if multiprocess else self.registry
        self.submitted = Counter("carpool_jobs_submitted_total", "Jobs accepted and queued.",
                                 BIN_LABELS, registry=own)
        self.rejected = Counter("carpool_jobs_rejected_total", "Jobs refused, by reason.",
                                ("model", "reason"), registry=own)
        self.abandoned = Counter("carpool_jobs_abandoned_total", "Jobs cancelled while "
                                 "queued because their synchronous caller hung up.",
                                 ("model",), registry=own)
        self.long_polls = Gauge("carpool_web_long_polls", "Long-polls waiting now.",
                                registry=own, multiprocess_mode="livesum")
        self.event_streams = Gauge("carpool_web_event_streams", "Event streams open now.",
                                   registry=own, multiprocess_mode="livesum")
        bins = [(spec.name, b.name) for spec in catalogue for b in spec.bins]
        for model, bin_name in bins:  # every series exists from the start, at zero
            self.submitted.labels(model, bin_name)
        for spec in catalogue:
            self.abandoned.labels(spec.name)
            for reason in REASONS:
                self.rejected.labels(spec.name, reason)
        self.http_requests = Counter("carpool_http_requests_total",
                                     "HTTP requests answered, by route, method and status.",
                                     HTTP_LABELS, registry=own)
        self.http_duration = Histogram("carpool_http_request_duration_seconds",
                                       "Time to answer an HTTP request (a long-poll's wait "
                                       "included).", HTTP_LABELS, buckets=HTTP_BUCKETS_S,
                                       registry=own)
        self.shed = Counter("carpool_web_shed_total", "Admitting requests answered 503 "
                            "overloaded before they ran, by why.", ("reason",), registry=own)
        for reason in SHED_REASONS:
            self.shed.labels(reason)
        self.refusal_wait = Histogram("carpool_web_refusal_seconds", "How long admitting "
                                      "requests refused (429, 503) before admission waited "
                                      "at the web, from their bytes reaching the host.",
                                      buckets=REFUSAL_BUCKETS_S, registry=own)
        scan = [b.max_batch for spec in catalogue for b in spec.bins]
        #: Collectors that read Redis go here, not into ``registry`` (``RedisCollectors``).
        self.from_redis = RedisCollectors(queue.ping)
        self.from_redis.collectors.append(BinGauges(queue, bins, scan))
        self.registry.register(self.from_redis)
        # Each series' child, looked up once: ``labels()`` checks and converts its
        # values under a lock on every call, half the cost of counting a request.
        self._submitted_of: dict[tuple[str, str], Any] = {}
        self._http_of: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def count_submitted(self, admitted: Admitted) -> None:
        if admitted.duplicate:
            return
        key = (admitted.model, admitted.bin)
        child = self._submitted_of.get(key)
        if child is None:
            child = self._submitted_of[key] = self.submitted.labels(*key)
        child.inc()

    def count_refused_request(self, exc: Exception, req: Request) -> None:
        """Count a refused submission (an error raised while a submit route ran, its
        body read or its jobs admitted) under the model it named; other routes' errors
        are not job rejections. The error handlers call this (web/common/errors.py), and
        the lean routes with their own request (web/common/lean.py)."""
        if (req.endpoint in SUBMIT_ENDPOINTS and not req.environ.get(ADMITTED_ENVIRON)
                and not isinstance(exc, Unauthorized)):  # a credential, not a job, refused
            self.count_rejected(requested_model(self.catalogue, exc, req), exc,
                                jobs=g.get("carpool_refused_jobs", 1))

    def count_rejected(self, model: str, exc: Exception, jobs: int = 1) -> None:
        self.rejected.labels(model, rejection_reason(exc)).inc(jobs)

    def count_abandoned(self, model: str) -> None:
        self.abandoned.labels(model).inc()

    def count_shed(self, reason: str) -> None:
        self.shed.labels(reason).inc()

    def time_refusal(self, waited_s: float) -> None:
        self.refusal_wait.observe(waited_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def instrument(self, app: Flask) -> None:
        """Count and time every request ``app`` answers, errors included (the lean routes
        count their own the same way: web/common/lean.py)."""
        app.before_request(self.start_clock)
        app.after_request(self.count)

    def start_clock(self) -> None:
        g.carpool_t0 = time.perf_counter()

    def count(self, response: Response) -> Response:
        t0 = g.get("carpool_t0")
        if t0 is not None:
            route = request.url_rule.rule if request.url_rule is not None else "unmatched"
            self.observe_request(route, request.method, response.status_code,
                                 time.perf_counter() - t0)
        return response

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        # Routes are the app's patterns, methods a closed set, statuses HTTP's: bounded.
        key = (route, method if method in HTTP_METHODS else "other", status)
        children = self._http_of.get(key)
        if children is None:
            labels = (key[0], key[1], str(status))
            children = self._http_of[key] = (self.http_requests.labels(*labels),
                                             self.http_duration.labels(*labels))
        children[0].inc()
        children[1].observe(seconds)

