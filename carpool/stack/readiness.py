"""`carpool up` is ready when each worker it started has registered its models.

The web answering /readyz says nothing about the workers: each loads (and may
calibrate) its models, its entry in the model registry (carpool/backend/registry.py)
saying "loading" meanwhile, before it publishes which it serves and which it refused,
and why. Until then a job waits in its queue. So `carpool up` waits until every
worker's entry has finished loading before it says "ready" (and sends the demo's
job), and prints each model's state: served, refused (with the reason), or loading
(a worker it started has not registered, or is still loading).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.registry import Registry, WorkerModels, availability
from carpool.core.errors import CarpoolError
from carpool.core.settings import load_settings

#: How long `carpool up` waits for its workers to register: a first start loads and
#: calibrates every model, which on a slow machine takes minutes.
REGISTER_TIMEOUT_S = 180.0
#: How often it reads the registry meanwhile (one HGETALL: cheap).
REGISTER_POLL_S = 0.2


def unregistered(live: Sequence[WorkerModels], workers: Sequence[str]) -> list[str]:
    """The workers (by node name, "worker0", ...) that have no live entry yet, or whose
    entry is still loading models. An entry is named after the Celery node,
    "worker0@<host>"."""
    names = {w.worker.partition("@")[0] for w in live if not w.loading}
    return [w for w in workers if w not in names]


def model_states(live: Sequence[WorkerModels], models: Sequence[str],
                 waiting: Sequence[str]) -> list[tuple[str, str]]:
    """(model, its state in words) for each model, in order."""
    out = []
    for model in models:
        found = availability(live, model)
        servers = sorted(w.worker for w in live if model in w.served)
        if servers:
            out.append((model, f"served ({', '.join(servers)})"))
        elif waiting:
            out.append((model, f"loading ({', '.join(waiting)} not registered yet)"))
        elif found.refused:
            worker, reason = sorted(found.refused.items())[0]
            out.append((model, f"refused by {worker}: {reason}"))
        else:
            out.append((model, "no worker serves it"))
    return out


def model_lines(live: Sequence[WorkerModels], models: Sequence[str],
                waiting: Sequence[str]) -> list[str]:
    width = max((len(m) for m in models), default=0)
    return [f"model   {name:{width}s}  {state}" for name, state in
            model_states(live, models, waiting)]


def wait_registered(registry: Registry, workers: Sequence[str], timeout_s: float,
                    check: Callable[[], None], pause: Callable[[float], object],
                    poll_s: float = REGISTER_POLL_S,
                    clock: Callable[[], float] = time.monotonic,
                    ) -> tuple[list[WorkerModels], list[str]]:
    """The live entries once every worker in ``workers`` registered, or when
    ``timeout_s`` passed, and those still missing then. ``check`` raises to give up
    (the supervisor saw a crash loop); ``pause`` waits between reads."""
    deadline = clock() + timeout_s
    while True:
        live = registry.live()
        missing = unregistered(live, workers)
        if not missing or clock() >= deadline:
            return live, missing
        check()
        pause(poll_s)


def report_until_ready(env: Mapping[str, str], workers: Sequence[str], log_dir: str,
                       check: Callable[[], None], pause: Callable[[float], object],
                       say: Callable[[str], None] = print,
                       timeout_s: float = REGISTER_TIMEOUT_S) -> list[str]:
    """Print each model's state now (when a worker is still loading), wait for every
    worker to register, print the states again and "ready", and answer the models
    served; raise ``CarpoolError`` naming the workers that did not register within
    ``timeout_s``."""
    settings = load_settings(env)
    models = list(settings.worker_models) or [spec.name for spec in settings.catalogue]
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    try:
        registry = Registry(client, Keys(settings.key_prefix))
        live = registry.live()
        missing = unregistered(live, workers)
        if missing:
            for line in model_lines(live, models, missing):
                say(line)
            live, missing = wait_registered(registry, workers, timeout_s, check, pause)
            say("")
        for line in model_lines(live, models, missing):
            say(line)
    finally:
        client.close()
    if missing:
        logs = ", ".join(f"{log_dir}/{w}.log" for w in missing)
        raise CarpoolError(f"{', '.join(missing)} did not register its models within "
                           f"{timeout_s:.0f} s (still loading?); see {logs}")
    say(f"ready   every worker registered its models ({len(workers)} of {len(workers)})")
    return sorted({model for w in live for model in w.served})
