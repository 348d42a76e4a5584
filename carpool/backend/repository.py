"""The model repository (Triton's repository API): which models are loaded, as a desired
state in Redis, and what the live workers made of it.

Each model's desired state lives in its ``{p.s}:mstats:<model>`` hash (keys.py): loaded
(the default: a model never touched is loaded) or unloaded, the override its last load
brought (carpool/core/overrides.py), and a generation that each change moves on
(lua/model_state.lua; admit.lua refuses an unloaded model). The workers that may serve
a model (those it is named for in CARPOOL_MODELS, or every worker whose CARPOOL_MODELS
is empty) read it between batches and act on each new generation: they load and warm
the model before they claim its jobs, or stop claiming it, finish their claimed batches
and free it. Each worker's registry entry (carpool/backend/registry.py) says which
generation it has acted on, and whether the model is loading, served or refused there:
from those come the index's states and a load's answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from carpool.backend.args import ModelStateArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.refused_models import RefusedJobs, first_refusal
from carpool.backend.registry import WorkerModels, availability
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ModelUnloaded
from carpool.core.jobs import MODEL_UNAVAILABLE
from carpool.core.script_args import argv, keys_of

#: The states of a model in the index, as Triton names them.
READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
#: How a load ended where no live worker serves it: refused by those that may serve
#: it, or none live may.
REFUSED, NO_WORKER = "REFUSED", "NO_WORKER"
#: The reason an unloaded model gives.
UNLOADED = "unloaded"
#: A load's ``expect`` when the caller saw a load in progress: it joins it.
IN_PROGRESS = -1


@dataclass(frozen=True)
class Desired:
    """One model's desired state."""

    loaded: bool = True
    generation: int = 0
    #: The override its last load brought, canonical JSON ("": the catalogue's entry).
    config: str = ""


class Repository:
    """Reads and changes the desired states; each change is one model_state.lua call."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._change = load_script(client, "model_state")
        self._jobs = RefusedJobs(client, keys)

    def read(self, models: Sequence[str]) -> dict[str, Desired]:
        """Each model's desired state, in one pipelined round trip."""
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model in models:
                pipe.hmget(self.keys.model_stats(model), ["unloaded", "gen", "config"])
            rows = pipe.execute()
        return {model: Desired(not unloaded, int(gen or 0), str(config or ""))
                for model, (unloaded, gen, config) in zip(models, rows, strict=True)}

    def load(self, model: str, config: str, expect: int) -> tuple[int, bool]:
        """Load ``model`` with ``config`` (canonical JSON, "" none): its generation, and
        whether this call started it (False: it joined the same load, started since
        the generation ``expect`` that the caller saw settled)."""
        return self._call(model, ModelStateArgs("load", config, expect))

    def unload(self, model: str) -> tuple[int, bool]:
        """Unload ``model``: its generation, and whether this call unloaded it."""
        return self._call(model, ModelStateArgs("unload", "", IN_PROGRESS))

    def end_queued(self, spec: ModelSpec) -> int:
        """End the queued jobs of an unloaded model "failed", with the reason: those
        queued at the unload, and any handed back to a bin since (their worker died)."""
        return self._jobs.fail_queued(spec, unloaded_message(spec.name))

    def _call(self, model: str, args: ModelStateArgs) -> tuple[int, bool]:
        with redis_errors():
            generation, changed = self._change(
                keys=keys_of(ModelStateArgs, model_stats=self.keys.model_stats(model)),
                args=argv(args))
        return int(generation), bool(changed)


def unloaded_message(model: str) -> str:
    """The error of a queued job whose model was unloaded before a worker took it."""
    return f"{MODEL_UNAVAILABLE}: {ModelUnloaded(model)}; no worker had taken this job"


def unsettled(live: Sequence[WorkerModels], model: str, generation: int) -> bool:
    """Whether a live worker that may serve ``model`` has yet to act on ``generation``,
    or is still loading it."""
    return any(model in w.generations and (w.generations[model] < generation
                                           or model in w.loading) for w in live)


def model_state(model: str, desired: Desired, live: Sequence[WorkerModels]) -> tuple[str, str]:
    """The model's state in the index, and why when it is not served."""
    found = availability(live, model)
    if not desired.loaded:
        if found.served_by:
            return UNLOADING, f"{UNLOADED}: finishing its claimed jobs"
        return UNAVAILABLE, UNLOADED
    if found.served_by:
        return READY, ""
    if found.loading_by or unsettled(live, model, desired.generation):
        return LOADING, ""
    if found.refused:
        return UNAVAILABLE, first_refusal(found)
    return UNAVAILABLE, "no live worker serves it: its jobs queue until one starts"


def load_outcome(model: str, generation: int,
                 live: Sequence[WorkerModels]) -> tuple[str, str]:
    """Where a load of ``generation`` stands: READY once a live worker serves it at that
    generation or a later one; LOADING while one that may serve it has not settled it;
    else REFUSED, with the first refusal, or NO_WORKER: no live worker may serve it."""
    acted = [w for w in live if w.generations.get(model, -1) >= generation]
    if any(model in w.served for w in acted):
        return READY, ""
    if unsettled(live, model, generation):
        return LOADING, ""
    refused: Mapping[str, str] = {w.worker: w.refused[model] for w in acted
                                  if model in w.refused}
    if refused:
        worker, reason = sorted(refused.items())[0]
        return REFUSED, f"worker {worker} refused it: {reason}"
    return NO_WORKER, ("no live worker may serve it (CARPOOL_MODELS): it stays loaded, and "
                       "a worker that may serve it loads it when it starts")
