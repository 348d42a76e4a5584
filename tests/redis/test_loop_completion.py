"""The batch loop against a private Redis that stops answering while two batches are
in flight (the pipelined executor): a completion that fails is reported for its own
batch, never for the batch still computing; a claim whose reply was lost has its jobs
handed back, not left to come back as suspects."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from carpool.backend import records
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import JobStatus
from carpool.core.settings import load_settings
from carpool.scheduling.batching import Go
from tests.conftest import make_env
from tests.support.faults import admit_jobs, statuses
from tests.support.observed import Recorder
from tests.support.procs import wait_until
from tests.support.redisproc import private_redis
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.leasekeeper import LeaseKeeper
from worker.loop.loop import BatchLoop

#: The loop's Redis client gives up on a hung Redis after this (the worker's is 11 s).
SOCKET_TIMEOUT_S = 1.0


class GatedHandler(SyntheticHandler):
    """The synthetic model, whose first batch computes until the test opens the gate."""

    def __init__(self, handler: SyntheticHandler) -> None:
        super().__init__(handler.spec, (0, 0))
        self.gate = threading.Event()
        self.calls = 0

    def forward(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        if self.calls == 1:
            self.gate.wait(60)
        return super().forward(batch)


def test_a_failed_completion_is_reported_for_its_own_batch_not_the_one_computing(
        key_prefix: str, tmp_path: Path) -> None:
    heard = Recorder()
    with private_redis() as server:
        queue = Queue(connect(server.url, socket_timeout_s=SOCKET_TIMEOUT_S), Keys(key_prefix))
        settings = load_settings(make_env(server.url, key_prefix))
        spec = settings.catalogue.get("synthetic")
        handler = GatedHandler(SyntheticHandler(spec, (0, 0)))
        loop = BatchLoop(settings, queue, {"synthetic": handler}, "w-test", observers=[heard],
                         executor=PipelinedExecutor(depth=2, preprocess_threads=1))
        thread = threading.Thread(target=loop.run, daemon=True)
        admit_jobs(queue, spec, range(2))
        thread.start()
        started = lambda: heard.tokens("claimed")  # noqa: E731
        wait_until(lambda: len(started()) == 1, 30, "batch A to start")
        admit_jobs(queue, spec, range(2, 4))
        wait_until(lambda: len(started()) == 2, 30, "batch B to start behind A")
        older, computing = started()
        server.signal(signal.SIGSTOP)  # A's write, once A is computed, cannot go through
        try:
            loop.stop()  # so the writer gives up on A after one try
            handler.gate.set()
            wait_until(lambda: any(h in ("finished", "failed") for h in heard.events()), 30,
                       "a batch to be reported ended")
            first_ended = next((h, c.token) for h, c, _ in heard.calls
                               if h in ("finished", "failed"))
        finally:
            server.signal(signal.SIGCONT)
        thread.join(30)
        loop.executor.close()
        queue.client.close()
    assert first_ended == ("failed", older)  # A ended without completing; B was computing
    assert computing != older


def test_a_claim_whose_reply_was_lost_is_handed_back_with_its_attempt_refunded(
        key_prefix: str) -> None:
    with private_redis() as server:
        queue = Queue(connect(server.url, socket_timeout_s=SOCKET_TIMEOUT_S), Keys(key_prefix))
        settings = load_settings(make_env(server.url, key_prefix))
        spec = settings.catalogue.get("synthetic")
        ids = admit_jobs(queue, spec, range(3))
        keeper = LeaseKeeper(Leases(queue.client, queue.keys, settings.catalogue), settings)
        loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(spec, (0, 0))},
                         "w-test", keeper=keeper)
        # A claim on an empty bin loads claim.lua, as a running worker has it loaded.
        assert not queue.claim(spec, "medium", 1, lease_ms=1000, token="warm", worker="w").jobs
        server.signal(signal.SIGSTOP)
        try:
            with pytest.raises(BackendUnavailable):
                loop.run_one(Go("synthetic", "small", 8))  # times out: no reply
        finally:
            server.signal(signal.SIGCONT)
        # Redis ran the claim once it woke: three jobs leased to a token nobody holds.
        wait_until(lambda: set(statuses(queue, ids).values()) == {JobStatus.RUNNING}, 10,
                   "the claim sent before Redis froze to run")
        keeper.tick()
        assert set(statuses(queue, ids).values()) == {JobStatus.QUEUED}
        # Refunded: the record keeps the count from before the claim (none: 0).
        assert [int((records.read(queue.client, queue.keys.job(i)) or {}).get("attempts", 0))
                for i in ids] == [0] * 3
        assert queue.client.zrange(queue.keys.bin("synthetic", "small"), 0, -1) == ids
        queue.client.close()
