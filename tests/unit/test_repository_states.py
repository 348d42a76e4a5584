"""The repository's states from the workers' registry entries (pure): the index's state
of a model and where a load stands, as the web reads them."""

from __future__ import annotations

from carpool.backend.registry import WorkerModels
from carpool.backend.repository import (
    LOADING,
    NO_WORKER,
    READY,
    REFUSED,
    UNAVAILABLE,
    UNLOADING,
    Desired,
    load_outcome,
    model_state,
)


def worker(name: str, generation: int, *, served: tuple[str, ...] = (),
           loading: tuple[str, ...] = (), refused: str = "") -> WorkerModels:
    return WorkerModels(name, served, {"m": refused} if refused else {}, loading,
                        generations={"m": generation})


def test_an_unloaded_model_is_unloading_while_a_worker_still_serves_it() -> None:
    unloaded = Desired(loaded=False, generation=3)
    assert model_state("m", unloaded, [worker("w1", 2, served=("m",))])[0] == UNLOADING
    assert model_state("m", unloaded, [worker("w1", 3)]) == (UNAVAILABLE, "unloaded")


def test_a_loaded_model_is_loading_until_every_worker_that_may_serve_it_acted() -> None:
    loaded = Desired(generation=4)
    assert model_state("m", loaded, [worker("w1", 3)]) == (LOADING, "")  # not yet read
    assert model_state("m", loaded, [worker("w1", 4, loading=("m",))]) == (LOADING, "")
    assert model_state("m", loaded, [worker("w1", 4, served=("m",))]) == (READY, "")
    refused = model_state("m", loaded, [worker("w1", 4, refused="no weights")])
    assert refused == (UNAVAILABLE, "worker w1 refused it: no weights")
    assert model_state("m", loaded, [])[0] == UNAVAILABLE  # scale from zero: jobs queue


def test_a_load_is_ready_only_once_served_at_its_generation_or_a_later_one() -> None:
    old = worker("w1", 4, served=("m",))  # serves the generation before this load
    assert load_outcome("m", 5, [old])[0] == LOADING
    assert load_outcome("m", 5, [worker("w1", 6, served=("m",))]) == (READY, "")
    both = [worker("w1", 5, refused="bad"), worker("w2", 5, loading=("m",))]
    assert load_outcome("m", 5, both)[0] == LOADING  # w2 may still serve it
    assert load_outcome("m", 5, both[:1]) == (REFUSED, "worker w1 refused it: bad")
    other = WorkerModels("w3", ("x",), {}, generations={"x": 9})  # may not serve m
    assert load_outcome("m", 5, [other])[0] == NO_WORKER
