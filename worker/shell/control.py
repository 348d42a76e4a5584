"""Celery remote control of the scheduler: read each worker's state, retune it live.

    celery -A worker.celery_app inspect carpool_scheduler [model ...]
    celery -A worker.celery_app control carpool_tune synthetic max_batch=8 max_wait_ms=5
    celery -A worker.celery_app control carpool_tune synthetic bin=small adaptive=off
    celery -A worker.celery_app control carpool_tune synthetic paused=on | reset=1

A change applies to every bin of the model (or to ``bin=``), from the next
decision of the batching loop on: no restart, nothing lost. It lives in that
worker's memory: a restarted worker starts from the catalogue again. Settings:
``max_batch``, ``max_wait_ms``, ``p99_target_ms`` (integers), ``adaptive`` and
``paused`` (on/off), ``reset=1`` (back to the catalogue first).

Commands run in the worker's main thread; the scheduler they change is locked
against the loop's thread. Importing this module registers them with Celery.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from celery.worker.control import control_command, inspect_command

from carpool.core.errors import ConfigError
from carpool.scheduling.scheduler import TUNABLE, Scheduler

_TRUE, _FALSE = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def _scheduler(state: Any) -> Scheduler | None:
    loop = getattr(state.consumer.controller, "carpool_loop", None)  # set by the bootstep
    return None if loop is None else loop.scheduler


def _value(name: str, raw: Any) -> Any:
    kind = TUNABLE.get(name)
    if kind is None:
        raise ConfigError(f"cannot tune {name!r}; tunable: {sorted(TUNABLE)}, bin, reset")
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in _TRUE + _FALSE:
            return str(raw).lower() in _TRUE
        raise ConfigError(f"{name}={raw!r}: use on or off")
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def parse_changes(changes: Iterable[str] | Mapping[str, Any]) -> dict[str, Any]:
    """``["max_batch=8", "adaptive=off"]`` (the command line) or a dict, typed."""
    pairs = changes.items() if isinstance(changes, Mapping) else (
        tuple(c.split("=", 1)) if "=" in c else (c, "") for c in changes)
    out: dict[str, Any] = {}
    for name, raw in pairs:
        if name == "bin":
            out["bin"] = str(raw)
        elif name == "reset":
            out["reset"] = str(raw).lower() in _TRUE or raw is True
        else:
            out[name] = _value(name, raw)
    return out


@inspect_command(variadic="models", signature="[model ...]")  # type: ignore[untyped-decorator]
def carpool_scheduler(state: Any, models: Iterable[str] | None = None,
                      **kwargs: Any) -> dict[str, Any]:
    """Each bin's limits, fitted cost model, arrival rate and recent batch sizes."""
    scheduler = _scheduler(state)
    if scheduler is None:
        return {"error": "no carpool batch loop runs in this worker"}
    wanted = set(models or ())
    return {"bins": [b for b in scheduler.snapshot() if not wanted or b["model"] in wanted]}


@control_command(  # type: ignore[untyped-decorator]
    args=[("model", str)], variadic="changes",
    signature="<model> [bin=NAME] [max_batch=N] [max_wait_ms=N] [adaptive=on|off] "
              "[paused=on|off] [p99_target_ms=N] [reset=1]",
)
def carpool_tune(state: Any, model: str, changes: Iterable[str] | Mapping[str, Any] = (),
                 **kwargs: Any) -> dict[str, Any]:
    """Change a model's batching limits from its next batch on."""
    scheduler = _scheduler(state)
    if scheduler is None:
        return {"error": "no carpool batch loop runs in this worker"}
    try:
        parsed = parse_changes(changes)
        bin_name = parsed.pop("bin", None)
        reset = bool(parsed.pop("reset", False))
        bins = scheduler.tune(model, bin_name, reset=reset, **parsed)
    except (ConfigError, ValueError) as exc:
        return {"error": str(exc)}
    return {"ok": f"{model}: {len(bins)} bin(s) retuned", "bins": bins}
