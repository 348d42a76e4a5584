"""Admission counts workers that are starting (coming.lua, lib/pace.lua's model_coming)
from when they will serve, on a real redis-server: a surge into a scaling pool is not
refused for capacity seconds away, nor admitted beyond what arrives in time."""

from __future__ import annotations

from carpool.admission.retry_after import DRAIN_TAU_MS
from carpool.backend.coming import Coming
from carpool.backend.queue import Queue
from carpool.core.errors import WaitTooLong
from tests.redis.test_admission_model_pace import admit, drain, fill_until_refused, spec_with

#: max_queue_ms of the model: a job must start within this.
LIMIT_MS = 1000


def refused_now(queue: Queue) -> bool:
    spec = spec_with(max_queue_ms=LIMIT_MS)
    try:
        admit(queue, spec, spec.bins[0])
    except WaitTooLong:
        return True
    return False


def test_workers_serving_within_the_wait_let_more_in_about_what_they_drain(
        queue: Queue) -> None:
    spec = spec_with(max_queue_ms=LIMIT_MS)
    small = spec.bins[0]
    drain(queue, spec, small)  # one worker's pace: 10 jobs in a 1 s batch
    before, exc = fill_until_refused(queue, spec, small)
    assert isinstance(exc, WaitTooLong)
    # Two workers serve 200 ms from now: 2 × 10 jobs/s × 0.8 s more start in time (up
    # to 2 × 10 × 1 s as the filling itself takes time), never more.
    Coming(queue.client, queue.keys).say(spec.name, 2, 200)
    more, exc = fill_until_refused(queue, spec, small)
    assert isinstance(exc, WaitTooLong)
    assert 14 <= more <= 20, (before, more)


def test_workers_that_serve_after_the_wait_let_nothing_more_in(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=LIMIT_MS)
    small = spec.bins[0]
    drain(queue, spec, small)
    fill_until_refused(queue, spec, small)
    Coming(queue.client, queue.keys).say(spec.name, 3, 2 * LIMIT_MS)
    assert refused_now(queue)


def test_no_drain_yet_no_speed_to_count_them_at(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=LIMIT_MS)
    Coming(queue.client, queue.keys).say(spec.name, 2, 0)
    fields = queue.client.hgetall(queue.keys.model_stats(spec.name))
    assert set(fields) == {"coming_n", "coming_at"}
    admit(queue, spec, spec.bins[0])  # depth alone: admitted


def test_saying_none_are_starting_keeps_the_last_entry_to_fade(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=LIMIT_MS)
    coming = Coming(queue.client, queue.keys)
    coming.say(spec.name, 2, 500)
    coming.say(spec.name, 0, 0)
    assert queue.client.hget(queue.keys.model_stats(spec.name), "coming_n") == "2"


def test_workers_that_served_long_ago_are_the_paces_own_now(queue: Queue) -> None:
    spec = spec_with(max_queue_ms=LIMIT_MS)
    small = spec.bins[0]
    drain(queue, spec, small)
    fill_until_refused(queue, spec, small)
    Coming(queue.client, queue.keys).say(spec.name, 2, 0)
    # As if they began serving 4 taus ago: the drain rate has learnt them by now.
    now_ms = int(queue.client.time()[0]) * 1000
    queue.client.hset(queue.keys.model_stats(spec.name), "coming_at",
                      now_ms - 4 * DRAIN_TAU_MS)
    assert refused_now(queue)
