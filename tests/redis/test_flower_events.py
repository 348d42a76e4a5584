"""Flower's batch events on a real Redis broker: a busy worker's batches share one
message a second, not three each; an idle worker's go at once."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from carpool.core.jobs import Claim, ClaimedJob
from worker.loop.observers import BatchReport
from worker.observe.flower import FLUSH_EVERY_S, FlowerBatchEvents


@pytest.fixture
def hostname() -> str:
    return f"probe-{uuid.uuid4().hex[:8]}@host"


@pytest.fixture
def events(redis_url: str, hostname: str) -> Iterator[tuple[FlowerBatchEvents, list[float]]]:
    now = [100.0]
    hooks = FlowerBatchEvents(Celery("t", broker=redis_url), hostname, clock=lambda: now[0])
    yield hooks, now
    hooks.close()


@pytest.fixture
def messages(client: redis.Redis) -> Iterator[redis.client.PubSub]:
    sub = client.pubsub()
    sub.psubscribe("*celeryev*")  # kombu's fanout channel for the "celeryev" exchange
    assert sub.get_message(timeout=5)["type"] == "psubscribe"
    yield sub
    sub.close()


def sent(sub: redis.client.PubSub, hostname: str) -> list[list[str]]:
    """The event types of each message our hooks sent, in order (others' skipped)."""
    out = []
    while (message := sub.get_message(timeout=0.3)) is not None:
        envelope = json.loads(message["data"])
        body: Any = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = json.loads(base64.b64decode(body))
        batch = body if isinstance(body, list) else [body]
        if batch and batch[0].get("hostname") == hostname:
            out.append([e["type"] for e in batch])
    return out


def batch(token: str) -> Claim:
    return Claim("synthetic", "small", token, 0, (ClaimedJob(f"id-{token}", "{}", 0, 1),))


def report(failed: int = 0) -> BatchReport:
    return BatchReport("synthetic", "small", 1, failed, 0, 0.01, 1.0, [0])


def test_batches_finished_within_a_second_go_as_one_message(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_claimed(batch("t0"))  # the first after a silence shows as started at once
    hooks.on_finished(batch("t0"), report())
    for i in range(1, 4):
        now[0] += 0.01
        hooks.on_claimed(batch(f"t{i}"))
        hooks.on_finished(batch(f"t{i}"), report(failed=1 if i == 3 else 0))
    assert sent(messages, hostname) == [["task-received", "task-started"]]
    hooks.on_idle()  # the worker has nothing left to do: all of it, in one message
    assert sent(messages, hostname) == [[
        "task-succeeded",
        *["task-received", "task-started", "task-succeeded"] * 2,
        "task-received", "task-started", "task-failed"]]


def test_a_batch_ending_once_the_oldest_unsent_event_is_a_second_old_goes_at_once(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_claimed(batch("a"))
    hooks.on_finished(batch("a"), report())
    hooks.on_idle()
    assert len(sent(messages, hostname)) == 2  # [received, started], [succeeded]
    # Times in binary fractions of a second, so that the sums are exact.
    now[0] += 0.25
    hooks.on_claimed(batch("b"))  # buffered: a message went 0.25 s ago
    now[0] += 0.25
    hooks.on_claimed(batch("c"))  # two in flight
    now[0] += 0.5
    # A second since the last message, but the oldest unsent event (b's claim) is
    # 0.75 s old.
    hooks.on_finished(batch("b"), report())
    assert sent(messages, hostname) == []
    now[0] += FLUSH_EVERY_S - 0.75
    hooks.on_finished(batch("c"), report())  # b's claim is a second old: all go now
    assert sent(messages, hostname) == [["task-received", "task-started"] * 2
                                        + ["task-succeeded"] * 2]


def test_idle_sends_what_is_buffered_and_nothing_when_nothing_is(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_idle()  # before any event: no dispatcher, no message
    hooks.on_claimed(batch("a"))
    now[0] += 0.1
    hooks.on_claimed(batch("b"))
    hooks.on_finished(batch("a"), report())
    hooks.on_finished(batch("b"), report())
    assert sent(messages, hostname) == [["task-received", "task-started"]]
    hooks.on_idle()
    assert sent(messages, hostname) == [["task-received", "task-started", "task-succeeded",
                                         "task-succeeded"]]
    hooks.on_idle()  # an idle worker calls it every second: an empty buffer sends nothing
    hooks.on_idle()
    assert sent(messages, hostname) == []


def test_a_batch_claimed_after_a_quiet_second_shows_as_started_before_it_ends(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_claimed(batch("a"))
    hooks.on_finished(batch("a"), report())
    now[0] += 0.1
    hooks.on_claimed(batch("b"))  # buffered: a message went out 0.1 s ago
    assert sent(messages, hostname) == [["task-received", "task-started"]]
    now[0] += FLUSH_EVERY_S
    hooks.on_claimed(batch("c"))
    assert sent(messages, hostname) == [["task-succeeded"] + ["task-received",
                                                               "task-started"] * 2]
    hooks.on_claimed(batch("d"))  # buffered again
    assert sent(messages, hostname) == []
    hooks.close()  # what is buffered goes out at stop
    assert sent(messages, hostname) == [["task-received", "task-started"]]


def test_a_claim_after_the_worker_idled_a_second_shows_as_started_at_once(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_claimed(batch("a"))
    hooks.on_finished(batch("a"), report())
    hooks.on_idle()
    assert len(sent(messages, hostname)) == 2
    now[0] += FLUSH_EVERY_S
    # The buffer was empty all along (the oldest-event rule alone would hold this one
    # until the batch ends, however long it runs).
    hooks.on_claimed(batch("b"))
    assert sent(messages, hostname) == [["task-received", "task-started"]]


def test_a_failed_completion_sends_at_once(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_claimed(batch("a"))
    now[0] += 0.1
    hooks.on_claimed(batch("b"))
    hooks.on_finished(batch("a"), report())
    assert len(sent(messages, hostname)) == 1
    hooks.on_failed(batch("b"))
    assert sent(messages, hostname) == [["task-received", "task-started", "task-succeeded"]]
