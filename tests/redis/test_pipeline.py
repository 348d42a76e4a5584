"""The torch-free pipeline: the synthetic model through the real loop and Redis,
two batches in flight, every job its own result."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest

import worker.loop.loop
from carpool.backend import records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.catalogue import BinSpec, load_catalogue
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import BinState, ClaimedJob, JobStatus, Outcome, new_job_id
from carpool.core.settings import Settings, load_settings
from carpool.core.synthetic import expected_result
from tests.conftest import make_env
from tests.support.observed import Recorder
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.base import ModelHandler
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.loop import BatchLoop

SPEC = load_catalogue(None).get("synthetic")


def admit_small(queue: Queue, n: int) -> list[str]:
    """``n`` jobs of size 1 (values 0..n-1) in the synthetic model's small bin."""
    small = SPEC.bin_named("small")
    return [single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        SPEC, (AdmitJob(small, new_job_id(SPEC.name), json.dumps({"value": i, "size": 1})),),
        queued_ttl_s=60))).id for i in range(n)]


def serve_until_final(loop: BatchLoop, queue: Queue, ids: list[str]) -> None:
    """Step the loop until every job has ended (a bounded number of steps), then drain."""
    peeked = None
    for _ in range(50):
        if all((v := queue.get(i)) is not None and v.status.is_final for i in ids):
            break
        peeked = loop.step(peeked)  # as BatchLoop._run: a completion's states go on
    else:
        pytest.fail("jobs did not finish")
    loop.drain()


def test_synthetic_batches_overlap_and_every_job_gets_its_own_result(
        settings: Settings, queue: Queue) -> None:
    heard = Recorder()
    small = SPEC.bin_named("small")
    inputs = [{"value": i, "size": 1} for i in range(70)]
    ids = [single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        SPEC, (AdmitJob(small, new_job_id(SPEC.name), json.dumps(x)),), queued_ttl_s=60))).id
           for x in inputs]
    executor = PipelinedExecutor(depth=2, preprocess_threads=2)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (5, 0))},
                     "w-test", observers=[heard], executor=executor)
    serve_until_final(loop, queue, ids)
    executor.close()
    views = [queue.get(i) for i in ids]
    assert [v.status for v in views if v] == [JobStatus.DONE] * 70
    assert [v.result for v in views if v] == [expected_result(x) for x in inputs]
    assert heard.events()[:3] == ["claimed", "claimed", "finished"]  # 2 claimed during 1


def test_a_batch_holding_a_retried_job_runs_with_no_other_batch_in_flight(
        settings: Settings, queue: Queue) -> None:
    ids = admit_small(queue, 70)
    records.update(queue.client, queue.keys.job(ids[32]), attempts=1)  # lost once: a retry
    unfinished_at_submit: list[int] = []

    class Watching(PipelinedExecutor):
        def submit(self, handler: ModelHandler, bin_spec: BinSpec,
                   jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
            unfinished_at_submit.append(sum(
                not v.status.is_final for i in ids
                if (v := queue.get(i)) is not None and v.status is not JobStatus.QUEUED))
            return super().submit(handler, bin_spec, jobs)

    executor = Watching(depth=2, preprocess_threads=2)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (5, 0))},
                     "w-test", executor=executor)
    serve_until_final(loop, queue, ids)
    executor.close()
    # Claimed but unfinished jobs when each batch was submitted (its own included):
    # batch 2 (the retry) found batch 1 written; batch 3 found batch 2 written.
    assert unfinished_at_submit == [32, 32, 6]


def test_the_cost_model_sees_a_batchs_own_time_not_its_wait_behind_the_batch_ahead(
        settings: Settings, queue: Queue) -> None:
    heard = Recorder()
    ids = admit_small(queue, 64)
    executor = PipelinedExecutor(depth=2, preprocess_threads=2)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (5, 0))},
                     "w-test", observers=[heard], executor=executor)
    serve_until_final(loop, queue, ids)
    executor.close()
    first, second = heard.reports()[:2]
    assert first.service_s == first.runtime_s  # nothing ahead of it
    assert 0 < second.service_s < second.runtime_s  # claimed while the first computed


def test_the_loop_feeds_each_finished_batch_to_its_scheduler(
        settings: Settings, queue: Queue) -> None:
    heard = Recorder()
    ids = admit_small(queue, 40)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (0, 0))},
                     "w-test", observers=[heard])
    serve_until_final(loop, queue, ids)
    loop.executor.close()
    seen = next(e for e in loop.scheduler.snapshot() if e["bin"] == "small")
    assert seen["recent_batch_sizes"] == [r.size for r in heard.reports()]
    assert sum(seen["recent_batch_sizes"]) == 40


def test_the_loop_ends_a_job_queued_longer_than_its_queued_ttl(
        redis_url: str, key_prefix: str, queue: Queue) -> None:
    settings = load_settings(make_env(redis_url, key_prefix, CARPOOL_QUEUED_TTL_S="60"))
    old, new = admit_small(queue, 2)
    record = queue.keys.job(old)
    t_admit = int((records.read(queue.client, record) or {}).get("t_admit", 0))
    records.update(queue.client, record, t_admit=t_admit - 61_000)  # queued 61 s, Redis's clock
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (0, 0))}, "w-test")
    serve_until_final(loop, queue, [old, new])
    views = [queue.get(old), queue.get(new)]
    assert [v.status for v in views if v] == [JobStatus.EXPIRED, JobStatus.DONE]


def test_a_worker_serving_one_model_decides_between_batches_without_a_peek(
        settings: Settings, queue: Queue) -> None:
    """Each completion answers its model's bin states (complete.lua), so once two
    batches are in flight the loop decides from those: no peek round trip of its own."""
    ids = admit_small(queue, 5 * 32)
    executor = PipelinedExecutor(depth=2, preprocess_threads=2)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (5, 0))},
                     "w-test", executor=executor)
    peeks: list[int] = []
    real_peek = queue.peek

    def counted_peek(*args: Any, **kwargs: Any) -> Any:
        peeks.append(1)
        return real_peek(*args, **kwargs)

    queue.peek = counted_peek  # type: ignore[method-assign]
    serve_until_final(loop, queue, ids)
    executor.close()
    assert loop.batches == 5
    # The first two claims fill the pipeline, each after a peek; a wait on a batch
    # that outlasted its bound would cost one more.
    assert len(peeks) <= 3, f"{len(peeks)} peeks for {loop.batches} batches"


def test_the_states_a_completion_answered_go_to_the_next_step_only_unless_it_failed(
        settings: Settings, queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that fails is followed by _run's back-off, so the next decision must peek:
    _run hands it no states."""
    monkeypatch.setattr(worker.loop.loop, "BACKOFF_MIN_S", 0.001)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (0, 0))},
                     "w-test")
    answered = (1, [BinState("synthetic", "small", 0, None)])
    given: list[Any] = []
    answers: list[Any] = [answered, RuntimeError("the executor refused the batch"), None,
                          answered, BackendUnavailable("Redis is away"), None]

    def step(peeked: Any = None) -> Any:
        given.append(peeked)
        answer = answers[len(given) - 1]
        if len(given) == len(answers):
            loop.stop()
        if isinstance(answer, Exception):
            raise answer
        return answer

    loop.step = step  # type: ignore[method-assign]
    loop._run()
    assert given == [None, answered, None, None, answered, None]
    loop.executor.close()


def test_the_pace_counts_a_batchs_own_busy_time_not_its_overlap_with_the_batch_ahead(
        settings: Settings, queue: Queue) -> None:
    heard = Recorder()
    ids = admit_small(queue, 64)
    executor = PipelinedExecutor(depth=2, preprocess_threads=2)
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(SPEC, (40, 0))},
                     "w-test", observers=[heard], executor=executor)
    serve_until_final(loop, queue, ids)
    executor.close()
    reports = heard.reports()
    own_ms = 1000 * sum(r.service_s for r in reports)
    overlap_ms = 1000 * sum(r.runtime_s - r.service_s for r in reports)
    assert overlap_ms > 20  # the second batch was claimed while the first computed
    # complete.lua summed each batch's own time (admit.lua's busy share and speed), not
    # its claim to completion, which counts the overlap twice. The worker measures it
    # as it sends the write, its report after the write: a round trip less. busy_c and
    # rate_c decay alike: their ratio, ms per job, does not.
    busy_c, rate_c = queue.client.hmget(queue.keys.model_stats(SPEC.name), "busy_c", "rate_c")
    busy_ms = float(busy_c or 0) / float(rate_c or 1) * sum(r.size for r in reports)
    assert own_ms - 10 * len(reports) <= busy_ms <= own_ms + 2 * len(reports)
