"""The remote-control commands' argument parsing and replies, without a broker."""

from types import SimpleNamespace
from typing import Any

import pytest

from carpool.core.catalogue import load_catalogue
from carpool.core.errors import ConfigError
from carpool.scheduling.scheduler import Scheduler
from worker.shell.control import carpool_scheduler, carpool_tune, parse_changes


def state_with(scheduler: Scheduler | None) -> Any:
    loop = None if scheduler is None else SimpleNamespace(scheduler=scheduler)
    return SimpleNamespace(consumer=SimpleNamespace(controller=SimpleNamespace(carpool_loop=loop)))


def test_command_line_changes_are_typed() -> None:
    assert parse_changes(["max_batch=8", "adaptive=off", "paused=on", "bin=small", "reset=1"]) \
        == {"max_batch": 8, "adaptive": False, "paused": True, "bin": "small", "reset": True}
    assert parse_changes({"max_wait_ms": "5", "adaptive": True}) == {"max_wait_ms": 5,
                                                                     "adaptive": True}


@pytest.mark.parametrize("bad", [["colour=red"], ["max_batch=many"], ["adaptive=maybe"]])
def test_unknown_settings_and_bad_values_are_refused(bad: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_changes(bad)


def test_tune_replies_with_the_new_limits_and_inspect_shows_them() -> None:
    state = state_with(Scheduler(load_catalogue(None)))
    reply = carpool_tune(state, "synthetic", ["bin=small", "max_batch=4", "adaptive=off"])
    assert [(b["bin"], b["max_batch"], b["adaptive"]) for b in reply["bins"]] == [
        ("small", 4, False)]
    shown = carpool_scheduler(state, ["synthetic"])["bins"]
    assert {b["bin"]: b["max_batch"] for b in shown} == {"small": 4, "medium": 32, "large": 16}


def test_errors_are_replies_not_exceptions() -> None:
    state = state_with(Scheduler(load_catalogue(None)))
    assert "error" in carpool_tune(state, "synthetic", ["max_batch=0"])
    assert "error" in carpool_tune(state, "nope", ["max_batch=2"])
    assert "error" in carpool_scheduler(state_with(None))
