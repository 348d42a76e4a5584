"""The models a worker serves, changed at run time by the repository API (Triton's
load and unload; carpool/backend/repository.py).

A worker may serve the models named in its CARPOOL_MODELS, or every catalogue model when
that is empty; no other. Between batches, at most every ``POLL_S``, the loop reads
their desired states (one pipelined read) and acts on each new generation, in its own
thread, so no batch of the model runs meanwhile:

- every batch in flight is completed first (claimed jobs finish, whatever the model);
- a load drops the model's old handler (a reload), loads the new one from the
  catalogue entry with the load's override, warms it, and only then adds its bins to
  the scheduler: no job of it is claimed before it is ready. A load that fails leaves
  the model refused here, with the reason;
- an unload takes its bins out of the scheduler (nothing more is claimed), drops the
  handler and frees its memory (the CUDA cache emptied on a GPU).

Each step is published in the worker's registry entry: loading, then served or refused,
with the generation acted on. The web ends an unloaded model's queued jobs at the
unload; a job handed back to its bin later (its worker died) is ended here, by every
``SWEEP_S``, with the same reason.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from carpool.backend.repository import Desired, Repository
from carpool.core.catalogue import Catalogue, ModelSpec
from carpool.core.overrides import apply_stored
from carpool.scheduling.batching import Cost
from carpool.scheduling.scheduler import BinKey
from worker.executors.base import BatchExecutor
from worker.executors.runner import HANDLER_ERRORS, message_of
from worker.handlers.base import ModelHandler

log = logging.getLogger(__name__)

#: How often the loop reads the desired states: a load or unload is acted on within
#: about this (plus the batch in hand), for one pipelined read of a few hashes.
POLL_S = 0.5
#: How often an unloaded model's bins are swept for jobs handed back after the unload.
SWEEP_S = 5.0

#: Makes and loads (and, on the torch executor, warms) a model's handler: the handler
#: and its bins' calibrated costs. Raises what the model's load raises.
Loader = Callable[[ModelSpec], tuple[ModelHandler, Mapping[BinKey, Cost]]]


class Host(Protocol):
    """The batch loop, as the repertoire changes it (worker/loop/loop.py)."""

    handlers: dict[str, ModelHandler]
    executor: BatchExecutor

    def drain(self) -> None: ...

    def add_model(self, handler: ModelHandler, cost_seeds: Mapping[BinKey, Cost]) -> None: ...

    def remove_model(self, model: str) -> None: ...


class Reporter(Protocol):
    """The worker's registry entry (worker/shell/presence.py)."""

    def loading(self, model: str) -> None: ...

    def settled(self, model: str, generation: int, *, served: bool,
                refused: str | None = None) -> None: ...


class Repertoire:
    """``poll(host)`` between batches; ``applied``: the generation acted on, per model
    this worker may serve (those read at start)."""

    def __init__(self, repository: Repository, catalogue: Catalogue, applied: dict[str, int],
                 loader: Loader, reporter: Reporter,
                 poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.repository = repository
        self.catalogue = catalogue
        self.applied = applied
        self.loader = loader
        self.reporter = reporter
        self.poll_s = poll_s
        self.clock = clock
        self._next_poll = self._next_sweep = clock()
        self._unloaded: set[str] = set()

    def poll(self, host: Host) -> bool:
        """Act on each new generation, when a read is due; True when the models served
        changed."""
        now = self.clock()
        if now < self._next_poll:
            return False
        self._next_poll = now + self.poll_s
        desired = self.repository.read(list(self.applied))
        self._unloaded = {m for m, d in desired.items() if not d.loaded}
        changed = [(m, d) for m, d in desired.items() if d.generation != self.applied[m]]
        if changed:
            host.drain()  # claimed batches finish before anything is dropped or loaded
        for model, want in changed:
            if want.loaded:
                self._load(host, model, want)
            else:
                self._unload(host, model, want.generation)
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            self._sweep()
        return bool(changed)

    def _load(self, host: Host, model: str, want: Desired) -> None:
        self.reporter.loading(model)
        if model in host.handlers:
            self._drop(host, model)  # a reload: the old one's memory goes first
        log.info("loading model %r (repository generation %d)", model, want.generation)
        try:
            handler, seeds = self.loader(apply_stored(self.catalogue.get(model), want.config))
        # Any load failure refuses the model, not the worker: a sys.exit or an
        # asyncio.CancelledError in it too (one ended the loop's thread, "loading" for ever).
        except HANDLER_ERRORS as exc:
            reason = f"{type(exc).__name__}: {message_of(exc)}"
            log.error("not serving model %r: its load failed: %s", model, reason)
            self.reporter.settled(model, want.generation, served=False, refused=reason)
        else:
            host.add_model(handler, seeds)
            self.reporter.settled(model, want.generation, served=True)
            log.info("loaded model %r (repository generation %d)", model, want.generation)
        self.applied[model] = want.generation

    def _unload(self, host: Host, model: str, generation: int) -> None:
        if model in host.handlers:
            self._drop(host, model)
            log.info("unloaded model %r (repository generation %d): its claimed jobs "
                     "finished, its memory freed", model, generation)
        self.reporter.settled(model, generation, served=False)
        self.applied[model] = generation
        self._sweep_one(model)

    def _drop(self, host: Host, model: str) -> None:
        host.remove_model(model)
        gc.collect()  # the handler's tensors go now, not at some later collection
        host.executor.release()  # empties the CUDA cache on a GPU

    def _sweep(self) -> None:
        for model in sorted(self._unloaded):
            self._sweep_one(model)

    def _sweep_one(self, model: str) -> None:
        ended = self.repository.end_queued(self.catalogue.get(model))
        if ended:
            log.warning("ended %d queued jobs of unloaded model %r", ended, model)
