"""A worker's presence on a real Redis: registered before its models load, every model
it will try "loading"; a refusal published at once, then acted on (the beat's hook
runs after the publish); the served models once the loop runs; withdrawn at stop."""

from __future__ import annotations

import threading

import redis

from carpool.backend.keys import Keys
from carpool.backend.registry import Registry, WorkerModels
from carpool.scheduling.batching import Cost
from tests.support.procs import wait_until
from worker.shell.presence import Presence

#: Far beyond the test: every publish seen here is one a change woke, not the timer.
SLOW_BEAT_S = 600.0


def test_a_refusal_is_published_at_once_and_the_hook_runs_after_it(
        client: redis.Redis, keys: Keys) -> None:
    registry = Registry(client, keys)
    seen: list[tuple[WorkerModels, list[WorkerModels]]] = []
    beat = threading.Event()

    def on_beat(entry: WorkerModels) -> None:
        seen.append((entry, registry.live()))  # what the registry said when the hook ran
        beat.set()

    presence = Presence(registry, "w1", ["synthetic", "resnet18"], interval_s=SLOW_BEAT_S,
                        on_beat=on_beat)
    presence.start()
    try:
        wait_until(beat.is_set, 10, "the first beat")
        assert registry.live() == [WorkerModels("w1", (), {}, ("synthetic", "resnet18"))]
        beat.clear()
        presence.refuse("resnet18", "no weights")
        wait_until(lambda: beat.is_set() and seen[-1][0].refused != {}, 10,
                   "the beat after the refusal")
        entry, live = seen[-1]
        assert entry == WorkerModels("w1", (), {"resnet18": "no weights"}, ("synthetic",))
        assert live == [entry]  # published before the hook ran
        presence.serve(["synthetic"])
        wait_until(lambda: registry.live() == [
            WorkerModels("w1", ("synthetic",), {"resnet18": "no weights"}, ())], 10,
            "the served models")
    finally:
        presence.stop()
    assert registry.live() == []


def test_the_entry_carries_the_costs_and_a_cold_start_once_measured(
        client: redis.Redis, keys: Keys) -> None:
    registry = Registry(client, keys)
    presence = Presence(registry, "w1", ["synthetic"], interval_s=SLOW_BEAT_S)
    presence.costs = lambda: {("synthetic", "small"): Cost(12.5, 0.25)}
    presence.start()
    try:
        presence.serve(["synthetic"])
        presence.cold_start("synthetic", 41.5)
        wait_until(lambda: [w.cold_start_s for w in registry.live()] == [{"synthetic": 41.5}],
                   10, "the cold start in the entry")
        assert registry.live()[0].costs == {("synthetic", "small"): Cost(12.5, 0.25)}
    finally:
        presence.stop()
