"""Quotas checked inside admit.lua (lua/lib/quota.lua), refusals counted in the hour's
usage and by service tier (lua/lib/usage.lua), against a real Redis."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest
from carpool.backend.queue import Queue
from carpool.core.api_keys import KeyPolicy
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import BinFull, BudgetFull, QuotaExceeded
from carpool.core.jobs import Admitted, Outcome, new_job_id
from tests.support.jobs import TTL_S, synthetic

ALICE, BOB = "a" * 64, "b" * 64


def _admit(admissions: Admissions, n: int, owner: str, max_depth: int = 5000,
           tier: str = "default", spec: ModelSpec | None = None) -> list[object]:
    spec = spec or synthetic(max_depth=max_depth)
    jobs = tuple(AdmitJob(spec.bin_for(1), new_job_id(spec.name),
                          json.dumps({"value": i, "size": 1})) for i in range(n))
    return list(admissions.admit(AdmitRequest(spec, jobs, queued_ttl_s=TTL_S, owner=owner,
                                              tier=tier)))


def _refused_by_tier(queue: Queue) -> dict[str, int]:
    """What GET /models shows for synthetic: its refusals by tier since they began."""
    _, (counts,) = queue.depths_and_refused([], ["synthetic"])
    return counts


def _usage(queue: Queue) -> dict[str, str]:
    hour = int(queue.client.time()[0]) // 3600
    return queue.client.hgetall(queue.keys.usage("synthetic", hour))


def test_refused_jobs_are_counted_per_owner_in_the_hours_usage(queue: Queue) -> None:
    admissions = Admissions(queue.client, queue.keys)
    got = _admit(admissions, 5, ALICE, max_depth=2)
    assert [type(o) for o in got] == [Admitted, Admitted, BinFull, BinFull, BinFull]
    _admit(admissions, 1, BOB, max_depth=2)
    assert (_usage(queue)[f"{ALICE}:r"], _usage(queue)[f"{BOB}:r"]) == ("3", "1")


def test_past_its_jobs_per_second_a_key_is_refused_with_the_wait_for_its_next_token(
        queue: Queue) -> None:
    admissions = Admissions(queue.client, queue.keys,
                            policies={ALICE: KeyPolicy(quota_jobs_per_s=2)})
    got = _admit(admissions, 5, ALICE)
    assert [type(o) for o in got] == [Admitted, Admitted] + [QuotaExceeded] * 3
    refused = got[2]
    assert isinstance(refused, QuotaExceeded) and refused.kind == "jobs"
    assert 0 < refused.retry_after_s <= 0.5
    assert "quota_jobs_per_s" in str(refused)
    assert isinstance(_admit(admissions, 1, ALICE)[0], QuotaExceeded)
    assert isinstance(_admit(admissions, 1, BOB)[0], Admitted)  # no quota of its own
    assert _usage(queue)[f"{ALICE}:r"] == "4"


def test_past_its_device_seconds_this_hour_a_key_is_refused_until_the_next_hour(
        queue: Queue) -> None:
    spec = synthetic()
    admissions = Admissions(queue.client, queue.keys,
                            policies={ALICE: KeyPolicy(quota_device_s_per_hour=1.0)})
    assert isinstance(_admit(admissions, 1, ALICE)[0], Admitted)
    claim = queue.claim(spec, "small", 10, lease_ms=5000, token="t", worker="w")
    queue.complete(spec, claim, [Outcome(j.id, result=1, device_ms=1000.0) for j in claim.jobs],
                   {"size": 1})
    (refused,) = _admit(admissions, 1, ALICE)
    assert isinstance(refused, QuotaExceeded) and refused.kind == "device"
    now_s = float(queue.client.time()[0])
    assert refused.retry_after_s == pytest.approx(3600 - now_s % 3600, abs=2)
    assert "1.0 s of its 1 device seconds" in str(refused)
    assert isinstance(_admit(admissions, 1, BOB)[0], Admitted)


def test_in_a_surge_flex_is_refused_first_and_priority_last(queue: Queue) -> None:
    flex, default, priority = "f" * 64, "d" * 64, "p" * 64
    admissions = Admissions(queue.client, queue.keys, policies={
        flex: KeyPolicy(tier="flex"), priority: KeyPolicy(tier="priority")})
    spec = synthetic(max_depth=10)

    def admitted(owner: str, tier: str) -> int:
        jobs = tuple(AdmitJob(spec.bin_for(1), new_job_id(spec.name), "{}") for _ in range(10))
        got = admissions.admit(AdmitRequest(spec, jobs, queued_ttl_s=TTL_S, owner=owner,
                                            tier=tier))
        return sum(isinstance(o, Admitted) for o in got)

    # Flex fills half the bound, default 80 % (room kept for the priority key), priority all.
    assert [admitted(flex, "flex"), admitted(default, "default"),
            admitted(priority, "priority")] == [5, 3, 2]
    # Each refusal counted in the model's stats hash for the tier it was made in.
    assert _refused_by_tier(queue) == {"flex": 5, "default": 7, "priority": 8}


def test_quota_and_byte_budget_refusals_count_for_the_requests_tier_and_a_repeat_for_none(
        queue: Queue) -> None:
    admissions = Admissions(queue.client, queue.keys, policies={
        ALICE: KeyPolicy(quota_jobs_per_s=2, tier="priority")})
    assert _refused_by_tier(queue) == {"flex": 0, "default": 0, "priority": 0}
    got = _admit(admissions, 5, ALICE, tier="flex")  # a priority key asking for flex
    assert [type(o) for o in got] == [Admitted, Admitted] + [QuotaExceeded] * 3
    assert _refused_by_tier(queue) == {"flex": 3, "default": 0, "priority": 0}
    one_job = len(json.dumps({"value": 0, "size": 1}))
    budgeted = replace(synthetic(), max_queued_bytes=one_job)  # 2 jobs already hold more
    (over,) = _admit(admissions, 1, BOB, tier="priority", spec=budgeted)
    assert isinstance(over, BudgetFull)
    assert _refused_by_tier(queue) == {"flex": 3, "default": 0, "priority": 1}
    spec = synthetic()
    job = AdmitJob(spec.bin_for(1), new_job_id(spec.name), "{}")
    for _ in range(2):  # the second answers the first job: not a refusal
        admissions.admit(AdmitRequest(spec, (job,), queued_ttl_s=TTL_S, owner=BOB,
                                      tier="default", idempotency_digest="k" * 64))
    assert _refused_by_tier(queue) == {"flex": 3, "default": 0, "priority": 1}
