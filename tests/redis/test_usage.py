"""What each job cost (its ``usage``) and the per-key, per-hour sums complete.lua keeps
(lua/lib/usage.lua), against a real Redis."""

from __future__ import annotations

from carpool.backend.queue import Queue
from carpool.backend.usage import USAGE_KEEP_S, key_label, read_usage
from carpool.core.jobs import Outcome
from tests.support.jobs import admit, synthetic

ALICE, BOB = "a" * 64, "b" * 64


def _hour(queue: Queue) -> int:
    return int(queue.client.time()[0]) // 3600


def test_a_batch_adds_each_owners_jobs_device_and_queue_time_once(queue: Queue) -> None:
    spec = synthetic()
    owners = [ALICE, ALICE, BOB]
    jobs = [admit(queue, spec, owner=o) for o in owners]
    claim = queue.claim(spec, "small", 10, lease_ms=5000, token="t", worker="w")
    shares_ms = [1.25, 1.25, 2.5]
    done = queue.complete(spec, claim, [Outcome(j, result=1, device_ms=d)
                                        for j, d in zip(jobs, shares_ms, strict=True)],
                          {"size": 3})
    assert done.written == [True] * 3
    views = queue.get_many(jobs)
    usage = [v.usage for v in views if v is not None]
    assert [u["device_ms"] for u in usage if u] == shares_ms
    hour = _hour(queue)
    key = queue.keys.usage("synthetic", hour)
    got = queue.client.hgetall(key)
    queued = {o: sum(u["queue_ms"] for u, oo in zip(usage, owners, strict=True)
                     if u and oo == o) for o in (ALICE, BOB)}
    assert got == {f"{ALICE}:j": "2", f"{ALICE}:d": "2500", f"{ALICE}:q": str(int(queued[ALICE])),
                   f"{BOB}:j": "1", f"{BOB}:d": "2500", f"{BOB}:q": str(int(queued[BOB]))}
    assert 0 < queue.client.ttl(key) <= USAGE_KEEP_S
    rows = read_usage(queue.client, queue.keys, ["synthetic"], hour - 1, hour, ALICE)
    assert [r.to_json() for r in rows] == [{"key": key_label(ALICE), "model": "synthetic",
                                            "jobs": 2, "device_ms": 2.5,
                                            "queue_ms": queued[ALICE], "refused": 0}]
    everyone = read_usage(queue.client, queue.keys, ["synthetic"], hour, hour, None)
    assert [(r.key, r.jobs) for r in everyone] == [(key_label(ALICE), 2), (key_label(BOB), 1)]


def test_a_job_whose_write_was_refused_adds_nothing(queue: Queue) -> None:
    spec = synthetic()
    jobs = [admit(queue, spec, owner=ALICE) for _ in range(3)]
    claim = queue.claim(spec, "small", 10, lease_ms=5000, token="t", worker="w")
    # The claim lost its second job (the reaper took it back): its write is refused.
    queue.client.hdel(queue.keys.claim(claim.jobs[0].id[:4], "t"), jobs[1])
    done = queue.complete(spec, claim, [Outcome(j, result=1, device_ms=1.0) for j in jobs],
                          {"size": 3})
    assert done.written == [True, False, True]
    got = queue.client.hgetall(queue.keys.usage("synthetic", _hour(queue)))
    assert (got[f"{ALICE}:j"], got[f"{ALICE}:d"]) == ("2", "2000")
