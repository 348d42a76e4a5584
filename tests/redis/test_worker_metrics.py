"""Worker metrics read against a real Redis: every listed metric emitted by web,
worker and webhook dispatcher together, and the loop counting the jobs its claim found expired."""

from __future__ import annotations

import redis
from prometheus_client import generate_latest

from carpool.backend import records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.need_gauges import NeedGauges, NeedReader
from carpool.backend.queue import Queue
from carpool.backend.registry import Registry
from carpool.backend.shadows import ShadowBook, ShadowCounters
from carpool.core.catalogue import ModelSpec
from carpool.core.jobs import Claim, JobStatus, Outcome, new_job_id
from carpool.core.settings import Settings
from carpool.core.synthetic import expected_result
from dispatcher.metrics import DispatchMetrics
from feeder.metrics import FeederMetrics
from tests.support.deployfiles import load_metrics
from tests.support.faults import admit_jobs
from tests.support.procs import wait_until
from tests.support.promtext import Scrape
from tests.unit.test_worker_metrics import (
    GPU,
    SMALL,
    collate_sizes,
    metrics,
    read,
    run_batch_of_three,
)
from web.common.metrics import WebMetrics
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.base import ModelHandler
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.loop import BatchLoop
from worker.loop.observers import BatchReport
from worker.observe.coldstart import ColdStart
from worker.observe.metrics import WorkerMetrics


def test_web_and_worker_emit_every_listed_metric_with_its_type_and_labels(
        queue: Queue, settings: Settings) -> None:
    executor = PipelinedExecutor()
    m = metrics([GPU], executor)
    run_batch_of_three(m)
    # The bootstep adds the cold start's observer beside the metrics, in their registry.
    ColdStart(m.registry, started_s=0.0).on_finished(
        Claim("synthetic", "small", "t", 0, ()),
        BatchReport("synthetic", "small", 1, failed=0, refused=0, runtime_s=0.1,
                    inference_ms=1.0, queue_ms=[0]))
    collate_sizes(executor, [16, 48, 32])  # padding waste appears once a batch has measured it
    executor.close()
    web = WebMetrics(queue, settings.catalogue)
    web.registry.register(NeedGauges(NeedReader(  # as web/app.py registers them
        queue.client, queue.keys, queue, Registry(queue.client, queue.keys),
        settings.catalogue, settings.cold_start_s)))
    # Shadow counters appear once a copy was compared: a done job as its own copy.
    spec = settings.catalogue.get("synthetic")
    (job,) = admit_jobs(queue, spec, [1])
    claim = queue.claim(spec, spec.bin_for(1).name, 8, lease_ms=60_000, token="sh", worker="w")
    queue.complete(spec, claim, [Outcome(job, result=expected_result({"value": 1, "size": 1}))],
                   {"size": 1})
    book = ShadowBook(queue, queue.keys)
    book.add("synthetic", [(job, job)], 0)
    web.registry.register(ShadowCounters(book, {"synthetic": spec.kind}))
    web.observe_request("/submit", "POST", 202, 0.001)  # HTTP series appear with a request
    hooks = DispatchMetrics()
    hooks.latency.observe(0.02)
    feeder = FeederMetrics()
    emitted = {**read(m).families, **Scrape(web.render().decode()).families,
               **Scrape(generate_latest(hooks.registry).decode()).families,
               **Scrape(generate_latest(feeder.registry).decode()).families}
    listed = load_metrics()
    assert set(emitted) == set(listed)
    for name, metric in listed.items():
        assert (emitted[name].type, emitted[name].labels) == (metric.type, set(metric.labels)), name


def admit_one(queue: Queue, spec: ModelSpec, job_id: str, deadline_ms: int) -> None:
    single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(spec.bins[0], job_id, '{"value": 1, "size": 1}'),),
        queued_ttl_s=60, deadline_ms=deadline_ms)))


def synthetic_handlers(settings: Settings) -> dict[str, ModelHandler]:
    return {"synthetic": SyntheticHandler(settings.catalogue.get("synthetic"), (0, 0))}


def step_until_one_completes(loop: BatchLoop) -> Scrape:
    """Step the loop until one job completed; the worker's metrics then."""
    m = WorkerMetrics(loop.handlers, limits=lambda: loop.limits)
    loop.observers.append(m)

    def drained() -> bool:
        loop.step()
        return read(m).value("carpool_jobs_completed_total") == 1

    wait_until(drained, 10, "the on-time job to complete")
    return read(m)


def test_the_loop_counts_jobs_that_claim_found_expired(
        queue: Queue, settings: Settings, client: redis.Redis) -> None:
    spec = settings.catalogue.get("synthetic")
    late, on_time = new_job_id(spec.name), new_job_id(spec.name)
    for job_id in (late, on_time):
        admit_one(queue, spec, job_id, 60_000)
    records.update(client, queue.keys.job(late), deadline=1)  # long past, on Redis's clock
    loop = BatchLoop(settings, queue, synthetic_handlers(settings), "w")
    s = step_until_one_completes(loop)
    assert s.value("carpool_jobs_expired_total", **SMALL) == 1
    assert s.value("carpool_batch_size_sum", **SMALL) == 1


def test_the_loop_gives_up_a_job_its_batch_would_finish_past_the_deadline(
        queue: Queue, settings: Settings) -> None:
    spec = settings.catalogue.get("synthetic")
    doomed, on_time = new_job_id(spec.name), new_job_id(spec.name)
    for job_id, deadline_ms in ((doomed, 2_000), (on_time, 60_000)):
        admit_one(queue, spec, job_id, deadline_ms)
    loop = BatchLoop(settings, queue, synthetic_handlers(settings), "w")
    for n in (1, 2, 1, 2):  # the bin's batches were measured at 5 s each
        loop.scheduler.observe("synthetic", SMALL["bin"], n, 5_000.0 + n, [5_000.0] * n)
    assert step_until_one_completes(loop).value("carpool_jobs_expired_total", **SMALL) == 1
    view = queue.get(doomed)
    assert view is not None and view.status is JobStatus.EXPIRED
    assert (view.error or "").startswith("cannot finish by its deadline")


def test_jobs_expired_by_a_claim_that_leased_none_count_late_with_the_next_batch(
        queue: Queue, settings: Settings) -> None:
    spec = settings.catalogue.get("synthetic")
    loop = BatchLoop(settings, queue, synthetic_handlers(settings), "w")
    for n in (1, 2, 1, 2):  # the bin's batches were measured at 5 s each
        loop.scheduler.observe("synthetic", SMALL["bin"], n, 5_000.0 + n, [5_000.0] * n)
    doomed = new_job_id(spec.name)
    admit_one(queue, spec, doomed, 2_000)
    wait_until(lambda: loop.step() is None and queue.get(doomed).status  # type: ignore[union-attr]
               is JobStatus.EXPIRED, 10, "a claim to expire the doomed job")
    admit_one(queue, spec, new_job_id(spec.name), 60_000)
    step_until_one_completes(loop)
    # Admission's late count (lib/pace.lua) holds the job no completion carried.
    late = queue.client.hget(queue.keys.model_stats("synthetic"), "late_c")
    assert late is not None and 0.9 <= float(late) <= 1.0  # decayed over a blink
