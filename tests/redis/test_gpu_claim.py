"""The GPU claim on real Redis, with an injected device list and several claimers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import redis

from carpool.backend.connection import connect
from carpool.backend.gpu_lease import GpuLeases
from carpool.backend.keys import Keys
from tests.support.procs import (
    wait_until,
)
from worker.device.gpu import Gpu, GpuClaim, discover_gpus

GPUS = discover_gpus(["GPU-aaaa", "GPU-bbbb", "GPU-cccc"])
#: Long enough that only a release, never a lapse, can free a GPU within a test.
LONG_LEASE_MS = 600_000
#: Short, for the tests where a dead worker's lease must run out.
SHORT_LEASE_MS = 300
#: Bound on any one wait below; none is expected to come near it.
TIMEOUT_S = 20.0


@pytest.fixture
def leases(redis_url: str, keys: Keys, client: redis.Redis) -> Iterator[GpuLeases]:
    """Leases on their own connection; ``client`` deletes this test's keys afterwards."""
    c = connect(redis_url)
    yield GpuLeases(c, keys)
    c.close()


class Waiter:
    """A claimer that acquires in a thread, as a replica started after the others would."""

    def __init__(self, claim: GpuClaim) -> None:
        self.claim = claim
        self.stop = threading.Event()
        self.got: Gpu | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.got = self.claim.acquire(self.stop.is_set)

    def join(self) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT_S)


def test_each_claimer_gets_its_own_gpu_and_the_extra_one_waits_and_says_so(
        leases: GpuLeases, caplog: pytest.LogCaptureFixture) -> None:
    claims = [GpuClaim(leases, GPUS, f"w{i}@host", LONG_LEASE_MS) for i in range(3)]
    got = [c.acquire() for c in claims]
    assert sorted(g.uuid for g in got if g) == [g.uuid for g in GPUS]
    caplog.set_level(logging.INFO, logger="worker.device.gpu")
    extra = Waiter(GpuClaim(leases, GPUS, "w3@host", LONG_LEASE_MS))
    try:
        wait_until(lambda: "waiting for a free GPU" in caplog.text, TIMEOUT_S, "a waiting log")
        assert extra.got is None and extra.thread.is_alive()
        assert "GPU-bbbb by w1@host" in caplog.text  # who holds what, for the operator
        claims[1].release()  # a warm shutdown hands the GPU back and wakes the waiter
        wait_until(lambda: extra.got is not None, TIMEOUT_S, "the waiter to get the GPU")
        assert extra.got == got[1]
    finally:
        extra.join()


def test_a_dead_workers_gpu_is_freed_once_its_lease_runs_out(leases: GpuLeases) -> None:
    dead = GpuClaim(leases, GPUS[:1], "dead@host", SHORT_LEASE_MS)
    assert dead.acquire() == GPUS[0]  # and it never renews: its process died
    successor = Waiter(GpuClaim(leases, GPUS[:1], "next@host", SHORT_LEASE_MS))
    try:
        wait_until(lambda: successor.got is not None, TIMEOUT_S, "the lease to run out")
        assert successor.got == GPUS[0]
        assert leases.holders([GPUS[0].uuid]) == {GPUS[0].uuid: "next@host"}
    finally:
        successor.join()


def test_a_renewed_lease_outlives_its_lease_time(leases: GpuLeases) -> None:
    alive = GpuClaim(leases, GPUS[:1], "alive@host", SHORT_LEASE_MS)
    assert alive.acquire() == GPUS[0]
    alive.keep()
    try:
        # Three renewals take at least one lease time: unrenewed, it would have lapsed.
        wait_until(lambda: alive.renewals >= 3, TIMEOUT_S, "three renewals")
        assert leases.claim([GPUS[0].uuid], "rival@host", SHORT_LEASE_MS).uuid is None
    finally:
        alive.release()
    assert leases.claim([GPUS[0].uuid], "rival@host", SHORT_LEASE_MS).uuid == GPUS[0].uuid


def test_a_worker_restarted_under_its_name_takes_its_own_gpu_back_at_once(
        leases: GpuLeases) -> None:
    first = GpuClaim(leases, GPUS, "w@container", LONG_LEASE_MS)
    assert first.acquire() == GPUS[0]
    GpuClaim(leases, GPUS, "other@host", LONG_LEASE_MS).acquire()  # takes GPUS[1]
    again = GpuClaim(leases, GPUS, "w@container", LONG_LEASE_MS)
    assert again.acquire() == GPUS[0]


def test_a_late_release_never_frees_a_gpu_another_worker_holds(leases: GpuLeases) -> None:
    uuid = GPUS[0].uuid
    assert leases.claim([uuid], "now@host", LONG_LEASE_MS).uuid == uuid
    assert not leases.release(uuid, "before@host")
    assert leases.renew(uuid, "before@host", LONG_LEASE_MS) == "now@host"
    assert leases.holders([uuid]) == {uuid: "now@host"}
