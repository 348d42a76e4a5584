"""A worker's repertoire (worker/loop/repertoire.py) acting on the repository's desired
states in a real Redis, around a recording stand-in for the batch loop: a load says
"loading" before it loads and adds the model only once loaded, an unload finishes the
batches in flight before it drops and frees the model, a failed load refuses the model
with the reason, and jobs handed back to an unloaded model's bin end with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import redis

from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.backend.repository import IN_PROGRESS, Repository
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.settings import Settings
from carpool.scheduling.batching import Cost
from tests.support.jobs import admit
from worker.handlers import make_handler
from worker.handlers.base import ModelHandler
from worker.loop.repertoire import SWEEP_S, Repertoire


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class Recorder:
    """The loop, its executor and the registry entry, each call noted in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.handlers: dict[str, ModelHandler] = {}
        self.executor = self

    def drain(self) -> None:
        self.calls.append(("drain",))

    def add_model(self, handler: ModelHandler, cost_seeds: Mapping[Any, Cost]) -> None:
        self.calls.append(("add", handler.spec.name))
        self.handlers[handler.spec.name] = handler

    def remove_model(self, model: str) -> None:
        self.calls.append(("remove", model))
        del self.handlers[model]

    def release(self) -> None:
        self.calls.append(("release",))

    def loading(self, model: str) -> None:
        self.calls.append(("loading", model))

    def settled(self, model: str, generation: int, *, served: bool,
                refused: str | None = None) -> None:
        self.calls.append(("settled", model, generation, served, refused))


@pytest.fixture
def repo(client: redis.Redis, keys: Keys) -> Repository:
    return Repository(client, keys)


def repertoire(repo: Repository, settings: Settings, host: Recorder, clock: Clock,
               fail: str = "") -> Repertoire:
    def loader(spec: ModelSpec) -> tuple[ModelHandler, dict[Any, Cost]]:
        host.calls.append(("loader", spec.options.get("load_delay_ms")))
        if fail:
            raise ConfigError(fail)
        handler = make_handler(spec, settings)
        handler.load()
        return handler, {}

    return Repertoire(repo, settings.catalogue, {"synthetic": 0}, loader, host, clock=clock)


def test_a_load_says_loading_finishes_the_batches_in_flight_then_adds_the_loaded_model(
        repo: Repository, settings: Settings) -> None:
    host, clock = Recorder(), Clock()
    watch = repertoire(repo, settings, host, clock)
    assert watch.poll(host) is False and host.calls == []  # nothing changed
    generation, _ = repo.load("synthetic", '{"options":{"load_delay_ms":1}}', IN_PROGRESS)
    assert watch.poll(host) is False  # read at most every POLL_S
    clock.now_s += watch.poll_s
    assert watch.poll(host) is True
    assert host.calls == [("drain",), ("loading", "synthetic"), ("loader", 1),
                          ("add", "synthetic"), ("settled", "synthetic", generation, True, None)]
    clock.now_s += watch.poll_s
    assert watch.poll(host) is False  # acted on once


def test_a_reload_frees_the_old_handler_first_and_a_failed_one_refuses_with_the_reason(
        repo: Repository, settings: Settings) -> None:
    host, clock = Recorder(), Clock()
    host.handlers["synthetic"] = make_handler(settings.catalogue.get("synthetic"), settings)
    watch = repertoire(repo, settings, host, clock, fail="no weights at /x")
    generation, _ = repo.load("synthetic", "", 0)
    assert watch.poll(host) is True
    assert host.calls == [("drain",), ("loading", "synthetic"), ("remove", "synthetic"),
                          ("release",), ("loader", None),
                          ("settled", "synthetic", generation, False,
                           "ConfigError: no weights at /x")]
    assert host.handlers == {}


def test_an_unload_finishes_the_batches_in_flight_then_drops_frees_and_sweeps_its_bins(
        repo: Repository, settings: Settings, queue: Queue, client: redis.Redis,
        keys: Keys) -> None:
    host, clock = Recorder(), Clock()
    spec = settings.catalogue.get("synthetic")
    host.handlers["synthetic"] = make_handler(spec, settings)
    watch = repertoire(repo, settings, host, clock)
    generation, _ = repo.unload("synthetic")
    assert watch.poll(host) is True
    assert host.calls == [("drain",), ("remove", "synthetic"), ("release",),
                          ("settled", "synthetic", generation, False, None)]
    # A job back in the bin after the unload (its worker died holding it): let in past
    # admission's refusal here, as the reaper puts it back.
    client.hdel(keys.model_stats("synthetic"), "unloaded")
    job_id = admit(queue, spec)
    client.hset(keys.model_stats("synthetic"), "unloaded", "1")
    clock.now_s += watch.poll_s
    watch.poll(host)
    assert (queue.get(job_id) or pytest.fail("gone")).status.value == "queued"
    clock.now_s += SWEEP_S
    watch.poll(host)
    view = queue.get(job_id)
    assert view is not None and view.status.value == "failed"
    assert view.error is not None and "'synthetic' was unloaded" in view.error
