"""Claiming ahead: a worker serving one model claims its next batch in the same script
call as its completion or its peek, when that batch is a full one its own decision is
sure to take; a batch so claimed that the decision does not take goes back, its attempt
refunded. Real Redis, the real queue, loop and lease keeper."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

import worker.loop.loop
from carpool.backend import records
from carpool.backend.connection import connect
from carpool.backend.keys import shard
from carpool.backend.leases import Leases
from carpool.backend.queue import ClaimAhead, Completed, Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import Claim, Outcome, new_job_id
from carpool.core.settings import Settings, load_settings
from carpool.core.synthetic import expected_result
from tests.conftest import make_env
from tests.support.faults import admit_jobs, attempts_of
from tests.support.hookrec import Recorder
from worker.executors.pipelined import PipelinedExecutor
from worker.handlers.synthetic import SyntheticHandler
from worker.loop.completion import CompletionWriter
from worker.loop.leasekeeper import LeaseKeeper
from worker.loop.loop import BatchLoop

BATCH = {"size": 0, "bin": "small", "worker": "w"}


def synthetic() -> ModelSpec:
    return load_catalogue(None).get("synthetic")


def bins_of(spec: ModelSpec) -> tuple[list[str], list[int]]:
    return [b.name for b in spec.bins], [b.max_batch for b in spec.bins]


def request(spec: ModelSpec, token: str = "ahead", max_n: Sequence[int] | None = None
            ) -> ClaimAhead:
    return ClaimAhead(token, 30_000, "w", 3600,
                      tuple(max_n if max_n is not None else bins_of(spec)[1]))


def depth(queue: Queue, spec: ModelSpec, bin_name: str = "small") -> int:
    return int(queue.client.zcard(queue.keys.bin(spec.name, bin_name)))


def leased(queue: Queue, spec: ModelSpec) -> list[str]:
    return [str(t) for t in queue.client.zrange(queue.keys.leases(shard(spec.name)), 0, -1)]


def test_a_peek_claims_the_full_batch_of_the_only_bin_with_jobs(queue: Queue) -> None:
    spec = synthetic()
    ids = admit_jobs(queue, spec, range(40))
    names, scan = bins_of(spec)
    _, states, claim = queue.peek_and_claim(spec, names, scan, request(spec))
    assert [s.depth for s in states] == [40, 0, 0]  # the states before the claim
    assert claim is not None and (claim.bin, claim.token) == ("small", "ahead")
    assert [j.id for j in claim.jobs] == ids[:32]  # the most urgent, in order
    assert [j.attempts for j in claim.jobs] == [1] * 32
    assert json.loads(claim.jobs[0].input_json) == {"value": 0, "size": 1}
    assert depth(queue, spec) == 8 and leased(queue, spec) == ["ahead"]
    assert attempts_of(queue, ids[0]) == 1  # counted in the claim hash, as claim.lua does


@pytest.mark.parametrize("case", ["not full", "two bins", "head deadline", "paused"])
def test_nothing_is_claimed_ahead_unless_the_decision_is_sure(queue: Queue, case: str) -> None:
    spec = synthetic()
    names, scan = bins_of(spec)
    max_n = list(scan)
    if case == "not full":
        admit_jobs(queue, spec, range(scan[0] - 1))
    elif case == "two bins":
        admit_jobs(queue, spec, range(40))
        admit_jobs(queue, spec, range(1), size=spec.bins[1].max_size)
    elif case == "head deadline":
        queue.admit(spec, spec.bins[0], new_job_id(spec.name), '{"value": 1, "size": 1}',
                    queued_ttl_s=3600, deadline_ms=60_000)
        admit_jobs(queue, spec, range(40))
    else:
        admit_jobs(queue, spec, range(40))
        max_n[0] = 0
    before = depth(queue, spec)
    _, states, claim = queue.peek_and_claim(spec, names, scan, request(spec, max_n=max_n))
    assert claim is None
    assert depth(queue, spec) == before == states[0].depth and leased(queue, spec) == []


def test_a_completion_claims_the_next_full_batch_after_its_write(queue: Queue) -> None:
    spec = synthetic()
    ids = admit_jobs(queue, spec, range(80))
    names, scan = bins_of(spec)
    first = queue.claim(spec, "small", 32, lease_ms=30_000, token="first", worker="w")
    done = queue.complete_and_peek(spec, first, [Outcome(j.id, result={"n": 1})
                                                 for j in first.jobs], BATCH, names, scan,
                                   request(spec, "next", max_n=(20, 32, 16)))
    assert done.written == [True] * 32
    assert done.states is not None and [s.depth for s in done.states] == [48, 0, 0]
    assert done.ahead is not None and [j.id for j in done.ahead.jobs] == ids[32:52]
    assert depth(queue, spec) == 28 and leased(queue, spec) == ["next"]
    plain = queue.complete_and_peek(spec, done.ahead, [Outcome(j.id, result={})
                                                       for j in done.ahead.jobs], BATCH,
                                    names, scan)
    assert plain.ahead is None and depth(queue, spec) == 28  # asked for none: claims none


class LostReplies(Queue):
    """The first completion runs in Redis and its reply is lost (a dropped connection)."""

    lost = 0

    def complete_and_peek(self, *args: Any, **kwargs: Any) -> Completed:
        done = super().complete_and_peek(*args, **kwargs)
        if self.lost == 0:
            self.lost += 1
            raise BackendUnavailable("connection dropped before the reply")
        return done


def test_a_batch_claimed_ahead_by_a_lost_reply_goes_back_with_its_attempt_refunded(
        queue: Queue, settings: Settings) -> None:
    spec = synthetic()
    ids = admit_jobs(queue, spec, range(64))
    names, scan = bins_of(spec)
    lossy = LostReplies(queue.client, queue.keys)
    first = lossy.claim(spec, "small", 32, lease_ms=30_000, token="first", worker="w")
    writer = CompletionWriter(lossy, threading.Event(), max_batch_s=60.0, worker="w")
    done = writer.write(spec, first, [Outcome(j.id, result={}) for j in first.jobs], BATCH,
                        time.perf_counter(), names, scan, request(spec, "lost"))
    assert done.written == [True] * 32  # the retry was refused; the records say ours
    assert done.ahead is None and writer.take_unanswered() == ["lost"]
    assert depth(queue, spec) == 0 and "lost" in leased(queue, spec)  # it did run
    keeper = LeaseKeeper(Leases(queue.client, queue.keys, settings.catalogue), settings)
    keeper.on_unanswered(Claim(spec.name, "small", "lost", 0, ()))
    keeper.recover_unanswered()
    assert depth(queue, spec) == 32 and leased(queue, spec) == []
    again = queue.claim(spec, "small", 32, lease_ms=30_000, token="again", worker="w")
    assert [j.id for j in again.jobs] == ids[32:] and {j.attempts for j in again.jobs} == {1}


class CountedClaims(Queue):
    """The real queue, counting the claims that were calls of their own."""

    claims = 0

    def claim(self, *args: Any, **kwargs: Any) -> Claim:
        self.claims += 1
        return super().claim(*args, **kwargs)


def serve(queue: Queue, settings: Settings, ids: list[str],
          hooks: list[Any]) -> BatchLoop:
    spec = synthetic()
    loop = BatchLoop(settings, queue, {"synthetic": SyntheticHandler(spec, (0, 0))}, "w",
                     hooks=hooks)
    for _ in range(200):  # a bound: each step claims, completes or waits once
        if all(v is not None and v.status.value == "done" for v in queue.get_many(ids)):
            return loop
        loop.step()
    raise AssertionError("the loop did not finish every job within 200 steps")


@pytest.mark.parametrize("ahead", [True, False])
def test_a_worker_serving_one_model_claims_its_full_batches_ahead(
        queue: Queue, settings: Settings, ahead: bool) -> None:
    spec = synthetic()
    counted = CountedClaims(queue.client, queue.keys)
    ids = admit_jobs(counted, spec, range(128))
    heard = Recorder()
    serve(counted, replace(settings, claim_ahead=ahead), ids, [heard])
    views = counted.get_many(ids)
    assert all(v is not None and v.result == expected_result({"value": i, "size": 1})
               for i, v in enumerate(views))
    assert heard.hooks().count("claimed") == 4  # four full batches of 32 either way
    # Ahead: the first peek claims the first batch and each completion the next, so no
    # claim is a call of its own; without, each batch is one.
    assert counted.claims == (0 if ahead else 4)
    assert "unneeded" not in heard.hooks()


def keeper_of(queue: Queue, settings: Settings) -> LeaseKeeper:
    return LeaseKeeper(Leases(queue.client, queue.keys, settings.catalogue), settings)


def loop_of(queue: Queue, settings: Settings, hooks: list[Any],
            executor: PipelinedExecutor | None = None) -> BatchLoop:
    spec = synthetic()
    return BatchLoop(settings, queue, {"synthetic": SyntheticHandler(spec, (0, 0))}, "w",
                     hooks=hooks, executor=executor or PipelinedExecutor())


def claimed_ahead(queue: Queue, token: str) -> Claim:
    """The full batch of small a peek claims ahead under ``token``."""
    spec = synthetic()
    names, scan = bins_of(spec)
    _, _, ahead = queue.peek_and_claim(spec, names, scan, request(spec, token))
    assert ahead is not None and len(ahead.jobs) == 32
    return ahead


def handing_back(queue: Queue, settings: Settings, heard: Recorder) -> BatchLoop:
    """A loop whose lease keeper hands back; claiming ahead off, or its completion
    would claim the jobs handed back ahead again."""
    return loop_of(queue, replace(settings, claim_ahead=False),
                   [heard, keeper_of(queue, settings)])


def test_a_batch_claimed_ahead_bigger_than_the_decision_runs_its_head_and_hands_back_the_rest(
        queue: Queue, settings: Settings) -> None:
    spec = synthetic()
    ids = admit_jobs(queue, spec, range(40))
    ahead = claimed_ahead(queue, "spare")
    heard = Recorder()
    loop = handing_back(queue, settings, heard)
    loop.scheduler.tune("synthetic", "small", max_batch=8)  # retuned meanwhile
    loop._ahead = ahead  # as the last peek left it
    loop.step()
    (claimed,) = [c for h, c, _ in heard.calls if h == "claimed"]
    (unneeded,) = [c for h, c, _ in heard.calls if h == "unneeded"]
    assert claimed.token == unneeded.token == "spare"  # no claim of its own
    assert [j.id for j in claimed.jobs] == ids[:8]
    assert [j.id for j in unneeded.jobs] == ids[8:32]
    # Back at the front, attempts refunded: the next batch of 8 is the next 8 most
    # urgent, each on its first run.
    again = queue.claim(spec, "small", 8, lease_ms=30_000, token="again", worker="w")
    assert [j.id for j in again.jobs] == ids[8:16] and {j.attempts for j in again.jobs} == {1}


def test_a_batch_claimed_ahead_for_another_bin_than_the_decisions_goes_back_whole(
        queue: Queue, settings: Settings) -> None:
    spec = synthetic()
    small = admit_jobs(queue, spec, range(32))
    ahead = claimed_ahead(queue, "small-ahead")
    assert depth(queue, spec) == 0
    admit_jobs(queue, spec, range(32), size=spec.bins[1].max_size)  # medium fills meanwhile
    heard = Recorder()
    loop = handing_back(queue, settings, heard)
    loop._ahead = ahead
    loop.step()  # the decision, from a fresh peek: medium (small is empty there)
    assert heard.tokens("unneeded") == ["small-ahead"]
    (claimed,) = [c for h, c, _ in heard.calls if h == "claimed"]
    assert claimed.bin == "medium" and claimed.token != "small-ahead"
    back = queue.claim(spec, "small", 32, lease_ms=30_000, token="back", worker="w")
    assert [j.id for j in back.jobs] == small and {j.attempts for j in back.jobs} == {1}


def test_no_batch_is_claimed_ahead_while_a_suspects_batch_is_to_run_alone(
        queue: Queue, settings: Settings) -> None:
    """A batch with a retried job runs with nothing else in flight (worker/loop/isolation.py);
    a batch claimed ahead meanwhile would wait behind it with its lease unrenewed."""
    spec = synthetic()
    ids = admit_jobs(queue, spec, range(96))
    records.update(queue.client, queue.keys.job(ids[40]), attempts=1)  # ran once before
    loop = loop_of(queue, settings, [], executor=PipelinedExecutor(depth=2))
    loop.step()  # the first batch: claimed by the peek, submitted (depth 2: not waited on)
    assert depth(queue, spec) == 64
    loop.step()  # the suspect's batch: the first completes, then it runs alone
    assert loop._ahead is None and depth(queue, spec) == 32  # the third is not claimed
    assert leased(queue, spec) == []


def test_claim_ahead_is_a_setting() -> None:
    env = make_env("redis://127.0.0.1:1/0", "unused")
    assert load_settings(env).claim_ahead is True
    assert load_settings({**env, "CARPOOL_CLAIM_AHEAD": "0"}).claim_ahead is False


def test_a_stopping_loop_hands_back_the_batch_it_claimed_ahead(
        queue: Queue, settings: Settings) -> None:
    spec = synthetic()
    admit_jobs(queue, spec, range(32))
    names, scan = bins_of(spec)
    _, _, ahead = queue.peek_and_claim(spec, names, scan, request(spec, "held"))
    loop = loop_of(queue, settings, [keeper_of(queue, settings)])
    loop._ahead = ahead
    loop.stop()
    loop.run()  # stopped before its first step: drains only
    assert depth(queue, spec) == 32 and leased(queue, spec) == []


def test_a_worker_serving_two_models_claims_nothing_ahead_and_serves_both(
        queue: Queue, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script touches one model's shard: a worker serving two models decides over
    both, so neither call may claim for it; and the peek after it idled sees both."""
    monkeypatch.setattr(worker.loop.loop, "MAX_BLOCK_S", 0.01)  # an idle step blocks this long
    one = synthetic()
    two = replace(one, name="synthetic-two")  # another shard
    assert shard(one.name) != shard(two.name)
    counted = CountedClaims(queue.client, queue.keys)
    loop = BatchLoop(settings, counted, {m.name: SyntheticHandler(m, (0, 0)) for m in (one, two)},
                     "w")

    def run_until_done(ids: list[str]) -> None:
        for _ in range(100):  # a bound: each step claims, completes or waits 10 ms
            if all(v is not None and v.status.value == "done" for v in counted.get_many(ids)):
                return
            loop.step()
        raise AssertionError("jobs left undone after 100 steps")

    first = admit_jobs(counted, one, range(64))
    run_until_done(first)
    loop.step()  # idle: the next step peeks every bin of both models
    second = admit_jobs(counted, two, range(64, 128))
    run_until_done(second)
    views = counted.get_many(first + second)
    assert all(v is not None and v.result == expected_result({"value": i, "size": 1})
               for i, v in enumerate(views))
    assert counted.claims == 4 and loop._ahead is None


def test_a_batch_handed_back_while_redis_is_away_is_looked_for_by_its_token(
        queue: Queue, settings: Settings) -> None:
    spec = synthetic()
    admit_jobs(queue, spec, range(32))
    ahead = claimed_ahead(queue, "stranded")
    away = connect("redis://127.0.0.1:1/0")  # nothing listens there
    keeper = keeper_of(Queue(away, queue.keys), settings)
    keeper.on_unneeded(ahead)  # the release fails: it is looked for on the next ticks
    keeper.leases = Leases(queue.client, queue.keys, settings.catalogue)  # Redis is back
    keeper.recover_unanswered()
    assert depth(queue, spec) == 32 and leased(queue, spec) == []
