"""The batch loop tells its hooks it idles (``on_idle``) right before it blocks on
Redis for work: not while a batch is in flight, nor while a bin fills its window."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

import pytest

import worker.loop.loop
from carpool.core.catalogue import BinSpec
from carpool.core.jobs import BinState, Claim, ClaimedJob, Outcome
from carpool.core.settings import load_settings
from tests.conftest import make_env
from tests.support.observed import Recorder
from worker.device.memory import MemoryGuard
from worker.executors.base import ExecutorStats
from worker.handlers.base import ModelHandler
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.loop import BatchLoop

#: A bound on any wait here; reaching it is a failure.
TIMEOUT_S = 10.0

NOW_MS = 1_000_000


class StubQueue:
    """Peeks whatever the test sets in ``depth``; records each wait for work, and the
    hooks' idle count when it began (so an ``on_idle`` after the wait does not count)."""

    def __init__(self, heard: Recorder) -> None:
        self.heard = heard
        self.depth = 0
        self.oldest_admit_ms: int | None = None
        self.waits: list[int] = []  # heard.idles at each wait_for_work

    def peek(self, bins: Sequence[tuple[str, str]],
             scan: Sequence[int] | None = None) -> tuple[int, list[BinState]]:
        states = [BinState(m, b, self.depth if i == 0 else 0,
                           self.oldest_admit_ms if i == 0 else None)
                  for i, (m, b) in enumerate(bins)]
        return NOW_MS, states

    def wait_for_work(self, models: Sequence[str], timeout_s: float) -> bool:
        self.waits.append(self.heard.idles)
        return False

    def claim(self, model: object, bin_name: str, max_n: int, *, token: str,
              **_: object) -> Claim:
        job = ClaimedJob(f"id-{token}", "{}", NOW_MS, 1)
        return Claim("synthetic", bin_name, token, NOW_MS, (job,))


class NeverDone:
    """An executor whose batches compute until the test ends."""

    depth = 2
    guard = MemoryGuard(None)
    stats = ExecutorStats()

    def limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return max_batch

    def view_limit(self, model: str, bin_name: str, max_batch: int) -> int:
        return max_batch

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        return Future()

    def close(self) -> None:
        return None


@pytest.fixture
def heard() -> Recorder:
    return Recorder()


@pytest.fixture
def queue(heard: Recorder) -> StubQueue:
    return StubQueue(heard)


@pytest.fixture
def loop(queue: StubQueue, heard: Recorder, monkeypatch: pytest.MonkeyPatch) -> BatchLoop:
    # A block on the batch in flight lasts this long instead of a second.
    monkeypatch.setattr(worker.loop.loop, "MAX_BLOCK_S", 0.001)
    # A fixed window: one job waits max_wait_ms for more (the adaptive policy, knowing
    # no arrival rate yet, would send it at once).
    settings = load_settings(make_env("redis://127.0.0.1:1/0", "unused",
                                      CARPOOL_ADAPTIVE_BATCHING="0"))
    handler = SyntheticHandler(settings.catalogue.get("synthetic"), (0, 0))
    return BatchLoop(settings, queue, {"synthetic": handler}, "w-test",  # type: ignore[arg-type]
                     observers=[heard], executor=NeverDone())


def test_an_idle_loop_tells_its_hooks_before_it_blocks_for_work(
        loop: BatchLoop, queue: StubQueue, heard: Recorder) -> None:
    loop.step()
    assert queue.waits == [1]  # on_idle came first, then the wait
    loop.step()  # still idle: told again at each block (Flower's is a no-op then)
    assert queue.waits == [1, 2]


def test_no_idle_while_a_batch_is_in_flight(
        loop: BatchLoop, queue: StubQueue, heard: Recorder) -> None:
    queue.depth, queue.oldest_admit_ms = 64, NOW_MS  # a full bin: it goes at once
    loop.step()
    assert heard.events() == ["claimed"]
    queue.depth, queue.oldest_admit_ms = 0, None
    loop.step()  # nothing to claim: waits on the batch in flight, not on Redis
    loop.step()
    assert (heard.idles, queue.waits) == (0, [])


def test_no_idle_while_a_bin_fills_its_batch_window(
        loop: BatchLoop, queue: StubQueue, heard: Recorder) -> None:
    # One job, just admitted: the bin waits up to max_wait_ms for more, on Redis.
    queue.depth, queue.oldest_admit_ms = 1, NOW_MS
    loop.step()
    assert (heard.idles, queue.waits) == (0, [0])


class DeviceBroke(NeverDone):
    """Every batch fails as a sticky CUDA error does."""

    def submit(self, handler: ModelHandler, bin_spec: BinSpec,
               jobs: Sequence[ClaimedJob]) -> Future[list[Outcome]]:
        from carpool.core.errors import DeviceLost

        future: Future[list[Outcome]] = Future()
        future.set_exception(DeviceLost("the CUDA context is lost: device-side assert"))
        return future


def test_a_lost_device_hands_the_batch_back_and_ends_the_loop_for_a_restart(
        loop: BatchLoop, queue: StubQueue, heard: Recorder) -> None:
    loop.executor = DeviceBroke()
    lost: list[Exception] = []
    loop.on_device_lost = lost.append
    queue.depth, queue.oldest_admit_ms = 64, NOW_MS
    done = threading.Thread(target=loop.run, daemon=True)
    done.start()
    done.join(TIMEOUT_S)
    assert not done.is_alive(), "the loop went on retrying on a lost device"
    assert len(lost) == 1 and "device-side assert" in str(lost[0])
    assert "failed" in heard.events()  # handed back, not written as failed results
