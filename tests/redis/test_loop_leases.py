"""The loop and its lease keeper: handing a batch back is the loop's own call, never a
hook's, so hooks that fail change nothing for any job. Real Redis, the real loop and
lease keeper."""

from __future__ import annotations

from typing import Any

import pytest

from carpool.backend.keys import shard
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.jobs import Claim, JobStatus
from carpool.core.settings import Settings
from carpool.core.synthetic import expected_result
from tests.support.faults import admit_jobs, attempts_of
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.leasekeeper import LeaseKeeper
from worker.loop.loop import BatchLoop, Peeked
from worker.loop.observers import BatchReport


class Raising:
    """A hook that raises in every method."""

    def on_claimed(self, claim: Claim) -> None:
        raise RuntimeError("on_claimed")

    def on_expired(self, claim: Claim) -> None:
        raise RuntimeError("on_expired")

    def on_finished(self, claim: Claim, report: BatchReport) -> None:
        raise RuntimeError("on_finished")

    def on_failed(self, claim: Claim) -> None:
        raise RuntimeError("on_failed")

    def on_idle(self) -> None:
        raise RuntimeError("on_idle")


def synthetic() -> ModelSpec:
    return load_catalogue(None).get("synthetic")


def depth(queue: Queue, spec: ModelSpec) -> int:
    return int(queue.client.zcard(queue.keys.bin(spec.name, "small")))


def leased(queue: Queue, spec: ModelSpec) -> list[str]:
    return [str(t) for t in queue.client.zrange(queue.keys.leases(shard(spec.name)), 0, -1)]


def loop_of(queue: Queue, settings: Settings, keeper: LeaseKeeper) -> BatchLoop:
    spec = synthetic()
    loop = BatchLoop(settings, queue, {spec.name: SyntheticHandler(spec, (0, 0))}, "w",
                     observers=[Raising()], keeper=keeper)
    loop.scheduler.tune(spec.name, "small", max_wait_ms=0)  # go at once
    return loop


@pytest.fixture
def keeper(queue: Queue, settings: Settings) -> LeaseKeeper:
    return LeaseKeeper(Leases(queue.client, queue.keys, settings.catalogue), settings)


def test_hooks_that_raise_in_every_method_change_nothing_for_any_job(
        queue: Queue, settings: Settings, keeper: LeaseKeeper) -> None:
    spec = synthetic()
    ids = admit_jobs(queue, spec, range(70))
    loop = loop_of(queue, settings, keeper)
    peeked: Peeked | None = None
    for _ in range(50):
        views = queue.get_many(ids)
        if all(v is not None and v.status.is_final for v in views):
            break
        peeked = loop.step(peeked)
    loop.drain()
    loop.executor.close()
    views = queue.get_many(ids)
    assert all(v is not None and v.status is JobStatus.DONE
               and v.result == expected_result({"value": i, "size": 1})
               for i, v in enumerate(views))
    assert leased(queue, spec) == []


def test_a_failing_batch_is_handed_back_though_every_hook_raises(
        queue: Queue, settings: Settings, keeper: LeaseKeeper) -> None:
    spec = synthetic()
    ids = admit_jobs(queue, spec, range(3))
    loop = loop_of(queue, settings, keeper)

    def failing_submit(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the executor refused the batch")

    loop.executor.submit = failing_submit  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="refused"):
        loop.step()
    loop.executor.close()
    assert depth(queue, spec) == 3 and leased(queue, spec) == []  # back now, not at lapse
    assert {attempts_of(queue, i) for i in ids} == {1}  # it may have run: still counted


class SteppedClock:
    """The keeper's clock: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_batch_computed_but_not_yet_written_past_max_batch_ms_is_no_hang(
        queue: Queue, settings: Settings) -> None:
    """The loop writes a batch's results a step later (pipelined) or, with Redis away,
    much later: once its forward pass has ended, the keeper must not call it hung."""
    spec = synthetic()
    admit_jobs(queue, spec, range(3))
    clock = SteppedClock()
    keeper = LeaseKeeper(Leases(queue.client, queue.keys, settings.catalogue), settings,
                         clock=clock)
    hung: list[str] = []
    keeper.on_hung = lambda claim, ran_s: hung.append(claim.token)
    loop = BatchLoop(settings, queue, {spec.name: SyntheticHandler(spec, (0, 0))}, "w",
                     keeper=keeper, executor=PipelinedExecutor(depth=2))  # as torch's
    loop.scheduler.tune(spec.name, "small", max_wait_ms=0)  # go at once
    loop.step(None)
    (flight,) = loop._in_flight
    flight.outcomes.result(timeout=30)  # the forward pass ended; nothing written yet
    clock.now_s += settings.max_batch_ms / 1000.0 + 1
    keeper.tick()
    assert hung == []
    loop.drain()
