"""Flower's batch events on a real Redis broker: one message per batch, not three."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from carpool.jobs import Claim, ClaimedJob
from worker.flower import FLUSH_EVERY_S, FlowerBatchEvents
from worker.hooks import BatchReport


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


def test_fast_batches_send_one_message_each_with_all_three_events(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_claimed(batch("t0"))  # the first after a silence shows as started at once
    hooks.on_finished(batch("t0"), report())
    for i in range(1, 4):
        now[0] += 0.01
        hooks.on_claimed(batch(f"t{i}"))
        hooks.on_finished(batch(f"t{i}"), report(failed=1 if i == 3 else 0))
    assert sent(messages, hostname) == [
        ["task-received", "task-started"], ["task-succeeded"],
        *[["task-received", "task-started", "task-succeeded"]] * 2,
        ["task-received", "task-started", "task-failed"]]


def test_a_batch_claimed_after_a_quiet_second_shows_as_started_before_it_ends(
        events: tuple[FlowerBatchEvents, list[float]], messages: redis.client.PubSub,
        hostname: str) -> None:
    hooks, now = events
    hooks.on_claimed(batch("a"))
    hooks.on_finished(batch("a"), report())
    now[0] += 0.1
    hooks.on_claimed(batch("b"))  # buffered: a message went out 0.1 s ago
    assert sent(messages, hostname) == [["task-received", "task-started"], ["task-succeeded"]]
    now[0] += FLUSH_EVERY_S
    hooks.on_claimed(batch("c"))
    assert sent(messages, hostname) == [["task-received", "task-started"] * 2]
    hooks.on_claimed(batch("d"))  # buffered again
    assert sent(messages, hostname) == []
    hooks.close()  # what is buffered goes out at stop
    assert sent(messages, hostname) == [["task-received", "task-started"]]
