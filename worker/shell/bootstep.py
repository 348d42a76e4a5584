"""The bootstep that starts and stops the batching loop inside a Celery worker.

The loop runs in its own thread, so the worker's main thread stays free for
heartbeats, pings and remote-control commands. A warm shutdown (SIGTERM) calls
``stop``: the loop finishes the batch in hand, then the thread ends; a batch still
running after ``CARPOOL_STOP_GRACE_S`` has its jobs handed back to the front of
their bin (its late results are then refused), so a stop never strands a job.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from celery import bootsteps
from celery.exceptions import WorkerShutdown
from celery.worker import state
from prometheus_client import disable_created_metrics

from carpool.backend.keys import Keys
from carpool.backend.leases import Leases
from carpool.backend.queue import Queue
from carpool.backend.refused_models import RefusedJobs
from carpool.backend.registry import Registry
from carpool.backend.repository import Desired, Repository
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError, DeviceLost
from carpool.core.jobs import Claim
from carpool.core.overrides import apply_stored
from carpool.core.settings import Settings, load_settings
from carpool.scheduling.batching import Cost
from worker.device.gpu import GpuClaim, claim_gpu, verify_visible
from worker.executors.base import BatchExecutor
from worker.executors.pipelined import PipelinedExecutor
from worker.executors.runner import is_sticky
from worker.handlers import TORCH_KINDS, ModelHandler, make_handler, resolve_device
from worker.loop import loop as loop_module
from worker.loop.isolation import SuspectIsolation
from worker.loop.leasekeeper import LeaseKeeper
from worker.loop.loop import MAX_BLOCK_S, BatchLoop
from worker.loop.repertoire import Repertoire
from worker.observe.coldstart import ColdStart, process_start_s
from worker.observe.flower import FlowerBatchEvents, flower_rows, worker_info
from worker.observe.metrics import GpuMemory, MetricsServer, WorkerMetrics, torch_gpu_memory
from worker.observe.profile import cost_seeds
from worker.shell.presence import Presence
from worker.shell.redis_start import reach_redis
from worker.shell.refusal_watch import RefusalWatch

log = logging.getLogger(__name__)

#: Redis socket timeout for the loop: above its longest block, so BLPOP never times out.
LOOP_SOCKET_TIMEOUT_S = MAX_BLOCK_S + 10.0


@dataclass(frozen=True)
class Loaded:
    """The models a worker serves (their handlers) and those it refused, with why."""

    handlers: dict[str, ModelHandler]
    refused: dict[str, str]


def load_handlers(settings: Settings, names: tuple[str, ...], explicit: bool,
                  ) -> dict[str, ModelHandler]:
    """Loaded handlers by model name (see ``load_models``)."""
    return load_models(settings, names, explicit).handlers


def load_one(spec: ModelSpec, settings: Settings) -> ModelHandler:
    """``spec``'s handler, made and loaded. Whatever its construction or load raises (a
    user's handler may raise anything: a missing weights file, a CUDA error, a
    ``sys.exit``) is a ``ConfigError`` naming the model, as the run-time load's refusal
    is (worker/loop/repertoire.py): else one model's error stopped a worker serving
    every model, and the log never named the model."""
    try:
        handler = make_handler(spec, settings)
        handler.load()
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 — named, then refused or fatal
        raise ConfigError(f"model {spec.name!r}: its load failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    return handler


def refuse(name: str, exc: ConfigError, fatal: bool,
           on_refused: Callable[[str, str], object] | None) -> str:
    """A model that cannot load or warm up: raises ``exc`` when ``fatal``; else the model
    is left out, the log says why in an ERROR line, ``on_refused`` is told. The reason."""
    if fatal:
        raise exc
    log.error("not serving model %r: %s (list the models to serve in CARPOOL_MODELS "
              "to make this fatal)", name, exc)
    if on_refused is not None:
        on_refused(name, str(exc))
    return str(exc)


def load_models(settings: Settings, names: tuple[str, ...], explicit: bool,
                on_refused: Callable[[str, str], object] | None = None,
                overrides: Mapping[str, str] | None = None) -> Loaded:
    """A model named in CARPOOL_MODELS that cannot load stops the worker; with
    CARPOOL_MODELS empty ("every model"), it is left out, the log says why in an
    ERROR line, and ``on_refused(model, reason)`` publishes the reason at once
    (worker/shell/presence.py). So is a model whose override (``overrides``: the
    repository API's, by model) does not load: the override is wrong, not the worker."""
    handlers: dict[str, ModelHandler] = {}
    refused: dict[str, str] = {}
    for name in names:
        stored = (overrides or {}).get(name, "")
        try:
            handler = load_one(apply_stored(settings.catalogue.get(name), stored), settings)
        except ConfigError as exc:
            refused[name] = refuse(name, exc, explicit and not stored, on_refused)
            continue
        handlers[name] = handler
    # None loaded: every model it may serve is unloaded, or one was refused for its
    # override, which a later load fixes: it waits (exiting was a crash loop). Else stop.
    if names and not handlers and not any((overrides or {}).get(m) for m in refused):
        raise ConfigError(f"none of the models {', '.join(names)} could be loaded")
    return Loaded(handlers, refused)


def make_executor(settings: Settings, handlers: dict[str, ModelHandler],
                  torch_later: bool = False,
                  on_failed: Callable[[str, ConfigError], object] | None = None,
                  ) -> tuple[BatchExecutor, dict[tuple[str, str], Cost]]:
    """The torch executor, warmed up and calibrated, when a torch model is served, or
    may be loaded later (``torch_later``: one it may serve is unloaded now);
    else the torch-free pipeline (torch is never imported), one batch at a time at
    depth 1. And
    the cost models that calibration profiles give each bin, to seed the scheduler.
    A model whose warm-up fails is a ``ConfigError`` naming it; with ``on_failed`` that
    is told it (and may raise), and the model leaves ``handlers``."""
    torch_handlers = [h for h in handlers.values() if h.spec.kind in TORCH_KINDS]
    if not torch_handlers and not torch_later:
        return PipelinedExecutor(settings.executor.pipeline_depth,
                                 settings.executor.preprocess_threads), {}
    from worker.executors.torch_executor import TorchExecutor
    from worker.observe.calibrate import prepare

    executor = TorchExecutor(settings.executor, resolve_device(settings.executor.device))
    seeds: dict[tuple[str, str], Cost] = {}
    for handler in torch_handlers:
        try:
            profile = prepare(executor, handler, settings.executor)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 — named, then refused or fatal
            if is_sticky(exc):  # the CUDA context is lost: for every model
                raise
            error = ConfigError(f"model {handler.spec.name!r}: its warm-up failed: "
                                f"{type(exc).__name__}: {exc}")
            if on_failed is None:
                raise error from exc
            on_failed(handler.spec.name, error)
            del handlers[handler.spec.name]
            continue
        if profile is not None:
            seeds.update(cost_seeds(profile))
    return executor, seeds


def load_at_run_time(settings: Settings, executor: BatchExecutor, spec: ModelSpec,
                     ) -> tuple[ModelHandler, dict[tuple[str, str], Cost]]:
    """A model the repository API loads (worker/loop/repertoire.py): made and loaded,
    then on the torch executor calibrated and warmed up as at start, with its bins'
    calibrated costs."""
    handler = make_handler(spec, settings)
    if spec.kind not in TORCH_KINDS:
        handler.load()
        return handler, {}
    from worker.executors.torch_executor import TorchExecutor
    from worker.observe.calibrate import prepare

    if not isinstance(executor, TorchExecutor):
        raise ConfigError(f"model {spec.name!r} runs on torch, and this worker started "
                          "without a torch model (so without the torch executor): restart "
                          "it to serve this model")
    handler.load()
    profile = prepare(executor, handler, settings.executor)
    return handler, cost_seeds(profile) if profile is not None else {}


def require_solo_pool(pool_cls: Any) -> None:
    """Refuse any pool but ``solo``: the batch loop, its CUDA context and its leases live
    in this one process. A forking pool (prefork, the default) forks children after
    the bootstep has initialised CUDA, which CUDA does not survive, and runs a second
    consumer of this worker's control queue beside the loop."""
    name = getattr(pool_cls, "__module__", None) or str(pool_cls)
    if name.rsplit(".", 1)[-1] != "solo":
        raise ConfigError(f"a carpool worker runs under --pool solo, not {name}: start it "
                          "as `carpool up` and the images do (carpool/stack/commands.toml)")


def gpu_memory_reader(executor: BatchExecutor) -> Callable[[], list[GpuMemory]]:
    """The metrics' GPU memory reader, bound to the executor's device only."""
    device = getattr(executor, "device", None)
    index = device.index if device is not None and device.type == "cuda" else None
    return lambda: torch_gpu_memory(index)


class BatchLoopStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Owns one BatchLoop and its thread for the life of the worker."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.loop: BatchLoop | None = None
        self.thread: threading.Thread | None = None
        self.events: Any = None
        self.gpu: GpuClaim | None = None
        self.metrics: WorkerMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        self.keeper: LeaseKeeper | None = None
        self.settings: Settings | None = None
        self.presence: Presence | None = None

    def start(self, parent: Any) -> None:
        require_solo_pool(getattr(parent, "pool_cls", "solo"))
        settings = self.settings = load_settings()
        hostname = parent.hostname
        self.gpu = claim_gpu(settings, hostname, _celery_stopping)  # before any model loads
        if settings.gpu_claim and self.gpu is None:
            raise WorkerShutdown(0)  # stopped while waiting for a GPU
        client = reach_redis(settings, LOOP_SOCKET_TIMEOUT_S, _celery_stopping)  # waits for it
        keys = Keys(settings.key_prefix)
        # The models it may serve, and which of them the repository API says are loaded.
        may_serve = settings.worker_models or tuple(spec.name for spec in settings.catalogue)
        desired = Repository(client, keys).read(may_serve)
        names = tuple(m for m in may_serve if desired[m].loaded)
        registry = Registry(client, keys)
        watch = RefusalWatch(registry, RefusedJobs(client, keys), settings.catalogue,
                             settings.refused_grace_s)
        # Registered before the first model loads: the web and the other workers see
        # every model it tries as "loading" until it serves or refuses it, and a
        # refusal is final for this worker as soon as it is published.
        self.presence = Presence(registry, settings.worker_name or hostname, names,
                                 on_beat=lambda entry: watch.tick(entry.refused),
                                 generations={m: d.generation for m, d in desired.items()})
        self.presence.start()
        try:
            self._start_serving(parent, settings, client, keys, desired)
        except BaseException:
            self.presence.stop()  # withdrawn: no entry says "loading" for a dead start
            self.presence = None
            raise

    def _start_serving(self, parent: Any, settings: Settings, client: redis.Redis, keys: Keys,
                       desired: dict[str, Desired]) -> None:
        """Load the models, start the batch loop; then the presence says what it serves."""
        assert self.presence is not None
        hostname = parent.hostname
        queue = Queue(client, keys)
        leases = Leases(client, keys, settings.catalogue)
        loaded = load_models(settings, tuple(m for m, d in desired.items() if d.loaded),
                             explicit=bool(settings.worker_models),
                             on_refused=self.presence.refuse,
                             overrides={m: d.config for m, d in desired.items()})
        handlers = loaded.handlers
        self.events = FlowerBatchEvents(parent.app, hostname)
        self.keeper = LeaseKeeper(leases, settings)
        presence = self.presence
        executor, seeds = make_executor(settings, handlers, torch_later=any(  # or refused:
            (not d.loaded or m in loaded.refused)  # a load may bring it (a fixed override)
            and settings.catalogue.get(m).kind in TORCH_KINDS
            for m, d in desired.items()), on_failed=lambda name, exc: refuse(
                name, exc, bool(settings.worker_models) and not desired[name].config,
                presence.refuse))
        if self.gpu is not None and self.gpu.gpu is not None:
            verify_visible(self.gpu.gpu)  # torch is imported now: does it see just ours?
        self.loop = BatchLoop(settings, queue, handlers, settings.worker_name or hostname,
                              observers=[self.events], keeper=self.keeper,
                              claim_filters=[SuspectIsolation(leases, settings.max_attempts)],
                              executor=executor, cost_seeds=seeds)
        loop = self.loop
        loop.on_device_lost = self._device_lost
        loop.repertoire = Repertoire(
            Repository(client, keys), settings.catalogue,
            {m: d.generation for m, d in desired.items()},
            loader=functools.partial(load_at_run_time, settings, executor),
            reporter=self.presence)
        # `<counter>_created` series would double the series count for a timestamp
        # that Prometheus does not use; this process exports nothing else.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
        self.metrics = WorkerMetrics(handlers, limits=loop.live_limits, stats=executor.stats,
                                     gpu_memory=gpu_memory_reader(executor))
        loop.observers.append(self.metrics)
        # The scaling rule's inputs travel in the registry entry: costs at each beat,
        # each model's cold start once its first batch ran.
        loop.observers.append(ColdStart(self.metrics.registry, process_start_s(),
                                        on_measured=self.presence.cold_start))
        self.presence.costs = loop.scheduler.costs
        executor.guard.on_shrink = self.metrics.record_shrink
        self.keeper.on_reclaimed = self.metrics.record_reclaimed
        self.keeper.on_hung = self._hung
        # A worker under this name that held claims is dead (this process holds the
        # name now): end its leases, so the keeper's first reap takes its jobs back
        # at once instead of when the leases run out.
        ended = leases.end_leases_of(loop.worker_name)
        if ended:
            log.warning("%d claims of a dead worker named %s ended: their jobs go back to "
                        "their bins now", ended, loop.worker_name)
        self.keeper.start()
        self.presence.serve(list(handlers))
        if settings.worker_metrics_port:
            try:
                self.metrics_server = self.metrics.serve(settings.worker_metrics_port,
                                                         settings.worker_metrics_addr)
            except ConfigError as exc:  # a second worker on the host: serve all the same
                log.warning("serving without a metrics endpoint: %s", exc)
        parent.carpool_loop = self.loop  # remote-control commands find it here
        self.thread = threading.Thread(target=self._run, name="carpool-batch-loop", daemon=True)
        self.thread.start()
        log.info("carpool batch loop started for models %s", ", ".join(handlers))

    def _device_lost(self, exc: DeviceLost) -> None:
        """The CUDA context is lost (the loop ended its leases): free the GPU's lease
        for the replica that replaces this process, then exit at once."""
        if self.gpu is not None:
            try:
                self.gpu.release()
            except Exception:  # noqa: BLE001 — the lease lapses instead
                log.exception("releasing the GPU after the device was lost failed")
        loop_module.exit_process(exc)

    def _hung(self, claim: Claim, ran_s: float) -> None:
        """A batch still computing past CARPOOL_MAX_BATCH_MS: its forward pass hangs, and
        no thread can stop it. The worker would heartbeat and serve nothing more (its one
        compute thread is taken) while its retried jobs came back to it, so its leases end
        as a dead worker's (the attempt counted: ``max_attempts`` fails an input that
        hangs every worker) and it exits for its supervisor to start a fresh one."""
        assert self.keeper is not None and self.loop is not None
        try:
            self.keeper.abandon_all(self.loop.worker_name)
        except Exception:  # noqa: BLE001 — the leases lapse and another reaper takes them
            log.exception("ending the leases of a hung batch failed")
        self._device_lost(DeviceLost(
            f"batch {claim.token} is still computing after {ran_s:.0f} s, past "
            "CARPOOL_MAX_BATCH_MS: its forward pass hangs, and no thread can stop it"))

    def _run(self) -> None:
        assert self.loop is not None
        try:
            self.loop.run()
        finally:
            if self.events is not None:
                self.events.close()

    def info(self, parent: Any) -> dict[str, Any]:
        """Added to `celery inspect stats`, which Flower shows on the worker's page."""
        return flower_rows(worker_info(self.loop, self.gpu.gpu if self.gpu else None))

    def stop(self, parent: Any) -> None:
        overran = self.loop is not None and self.thread is not None and self._stop_loop()
        if self.presence is not None:
            self.presence.stop()
            self.presence = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        if self.gpu is not None:
            self.gpu.release()  # after the last batch: the GPU is free for a waiting replica
            self.gpu = None
        if overran:  # its jobs are handed back: go, not wait for its compute thread
            loop_module.exit_stopped()

    def _stop_loop(self) -> bool:
        """Stop the loop within the grace and hand back what it holds; True if the batch
        in hand outlasted the grace."""
        assert self.loop is not None and self.thread is not None
        assert self.keeper is not None and self.settings is not None
        grace_s = self.settings.stop_grace_s
        log.info("carpool batch loop stopping after the batch in hand (grace %.0f s)", grace_s)
        self.loop.stop()
        self.thread.join(grace_s)
        self.keeper.stop()
        overran = self.thread.is_alive()
        # Overran: the batch was running, so its attempt stays counted. Otherwise only
        # claims that never reached the model can be left: their attempt is refunded.
        back = self.keeper.hand_back_all(refund_attempt=not overran)
        if not overran:
            self.loop.executor.close()  # its threads are idle once the loop has ended
        if overran:
            log.warning("the batch in hand outlasted the %.0f s grace: %d jobs handed back",
                        grace_s, back)
        log.info("carpool batch loop stopped; %d jobs handed back", back)
        return overran


def _celery_stopping() -> bool:
    """True once the worker was asked to stop (Celery's signal handlers set these)."""
    return state.should_stop is not None or state.should_terminate is not None
