"""Worker metrics: what a batch, an expiry, a shrink and a reclaim add; what a scrape reads."""

from __future__ import annotations

import json

from prometheus_client import generate_latest

from carpool.core.catalogue import load_catalogue
from carpool.core.jobs import Claim, ClaimedJob, Outcome
from carpool.scheduling.batching import Limits
from tests.support.promtext import Scrape
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.observers import BatchReport
from worker.observe.metrics import GpuMemory, WorkerMetrics

SPEC = load_catalogue(None).get("synthetic")
SMALL = {"model": "synthetic", "bin": "small"}
LIMITS = {("synthetic", b.name): Limits(b.max_batch, b.max_wait_ms) for b in SPEC.bins}
GPU = GpuMemory("GPU-0000", used_bytes=3 << 30, reserved_bytes=2 << 30, free_bytes=5 << 30)


def metrics(gpus: list[GpuMemory] | None = None,
            executor: PipelinedExecutor | None = None) -> WorkerMetrics:
    handlers = {"synthetic": SyntheticHandler(SPEC, (0, 0))}
    return WorkerMetrics(handlers, limits=lambda: LIMITS,
                         stats=executor.stats if executor is not None else None,
                         gpu_memory=lambda: gpus or [])


def collate_sizes(executor: PipelinedExecutor, sizes: list[int]) -> None:
    """Collate one batch of synthetic items of these sizes in bin small (max_size 64)."""
    executor.collate(SyntheticHandler(SPEC, (0, 0)),
                     [{"value": i, "size": s} for i, s in enumerate(sizes)],
                     SPEC.bin_named("small"))


def read(m: WorkerMetrics) -> Scrape:
    return Scrape(generate_latest(m.registry).decode())


def job(job_id: str, size: int, admit_ms: int) -> ClaimedJob:
    return ClaimedJob(job_id, json.dumps({"value": job_id, "size": size}), admit_ms, attempts=1)


def run_batch_of_three(m: WorkerMetrics) -> None:
    """a done, b failed, c done but refused (its lease was lost)."""
    claim = Claim("synthetic", "small", "t1", now_ms=10_000,
                  jobs=(job("a", 16, 9_000), job("b", 48, 9_500), job("c", 32, 9_750)))
    outcomes = (Outcome("a", result=1, preprocess_ms=4.0, inference_ms=30.0),
                Outcome("b", error="preprocess failed"),
                Outcome("c", result=1, preprocess_ms=4.0, inference_ms=30.0))
    m.on_claimed(claim)
    m.on_finished(claim, BatchReport("synthetic", "small", 3, failed=1, refused=1,
                                     runtime_s=0.25, inference_ms=30.0,
                                     queue_ms=[1000, 500, 250], outcomes=outcomes,
                                     written=(True, True, False)))


def test_a_batch_counts_each_written_job_once_and_the_batch_once() -> None:
    m = metrics()
    run_batch_of_three(m)
    s = read(m)
    assert s.value("carpool_batch_executions_total", **SMALL) == 1
    assert s.value("carpool_items_inferred_total", **SMALL) == 3
    assert (s.value("carpool_batch_size_count", **SMALL),
            s.value("carpool_batch_size_sum", **SMALL)) == (1, 3)
    assert s.value("carpool_jobs_completed_total", **SMALL) == 1  # c was refused
    assert s.value("carpool_jobs_failed_total", **SMALL) == 1
    assert s.value("carpool_queue_wait_seconds_count", **SMALL) == 2
    assert s.value("carpool_queue_wait_seconds_sum", **SMALL) == 1.5
    assert s.value("carpool_job_latency_seconds_sum", **SMALL) == 1.5 + 2 * 0.25
    assert s.value("carpool_preprocess_seconds_count", **SMALL) == 1  # completed jobs only
    assert s.value("carpool_inference_seconds_sum", **SMALL) == 0.03


def test_padding_waste_and_splits_are_read_from_the_executor_when_scraped() -> None:
    executor = PipelinedExecutor()
    m = metrics(executor=executor)
    assert read(m).series("carpool_padding_waste_ratio") == []  # no batch collated yet
    collate_sizes(executor, [16, 48, 32])
    executor.stats.oom_splits, executor.stats.error_splits = 2, 1
    executor.close()
    s = read(m)
    # Sizes 16, 48, 32 padded to the bin's 64: half of the batch is padding.
    assert s.value("carpool_padding_waste_ratio", **SMALL) == 0.5
    assert s.value("carpool_batch_splits_total", cause="out_of_memory") == 2
    assert s.value("carpool_batch_splits_total", cause="error") == 1


def test_expiries_shrinks_and_reclaimed_leases_are_counted() -> None:
    m = metrics()
    m.on_expired(Claim("synthetic", "large", "t", 0, jobs=(), expired=3))
    m.record_shrink("synthetic", "medium")
    m.record_reclaimed(2)
    s = read(m)
    assert s.value("carpool_jobs_expired_total", model="synthetic", bin="large") == 3
    assert s.value("carpool_batch_limit_shrinks_total", model="synthetic", bin="medium") == 1
    assert s.value("carpool_leases_reclaimed_total") == 2
    assert s.value("carpool_batch_executions_total") == 0


def test_batch_limits_are_read_when_scraped() -> None:
    limits = dict(LIMITS)
    m = WorkerMetrics({"synthetic": SyntheticHandler(SPEC, (0, 0))}, limits=lambda: limits)
    assert read(m).value("carpool_batch_limit", **SMALL) == 32
    limits[("synthetic", "small")] = Limits(8, 20)  # the memory guard halved it twice
    assert read(m).value("carpool_batch_limit", **SMALL) == 8


def test_gpu_memory_is_absent_on_the_cpu_and_labelled_by_gpu_uuid_on_a_gpu() -> None:
    assert "carpool_gpu_memory_used_bytes" not in read(metrics()).families
    s = read(metrics([GPU]))
    assert s.series("carpool_gpu_memory_free_bytes") == [{"gpu": "GPU-0000"}]
    assert s.value("carpool_gpu_memory_used_bytes", gpu="GPU-0000") == 3 << 30
    assert s.value("carpool_gpu_memory_reserved_bytes", gpu="GPU-0000") == 2 << 30


def test_usage_is_counted_per_key_and_keys_past_the_cap_share_the_label_other() -> None:
    from worker.observe.metrics import USAGE_METRIC_KEYS

    m = metrics()
    owners = [f"{i:02x}" * 32 for i in range(USAGE_METRIC_KEYS + 2)]
    jobs = tuple(ClaimedJob(f"j{i}", "{}", 9_000, attempts=1, owner=o)
                 for i, o in enumerate(owners))
    claim = Claim("synthetic", "small", "t1", now_ms=10_000, jobs=jobs)
    outcomes = tuple(Outcome(j.id, result=1, device_ms=2.0) for j in jobs)
    m.on_finished(claim, BatchReport("synthetic", "small", len(jobs), failed=0, refused=0,
                                     runtime_s=0.1, inference_ms=2.0, queue_ms=[1000] * len(jobs),
                                     outcomes=outcomes, written=(True,) * len(jobs)))
    s = read(m)
    first = owners[0][:12]
    assert s.value("carpool_usage_jobs_total", model="synthetic", key=first) == 1
    assert s.value("carpool_usage_device_seconds_total", model="synthetic", key=first) == 0.002
    assert s.value("carpool_usage_queue_seconds_total", model="synthetic", key=first) == 1.0
    assert s.value("carpool_usage_jobs_total", model="synthetic", key="other") == 2
    keys = {labels["key"] for labels in s.series("carpool_usage_jobs_total")}
    assert len(keys) == USAGE_METRIC_KEYS + 1
