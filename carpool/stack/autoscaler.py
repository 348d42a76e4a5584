"""`carpool up --workers MIN..MAX`: start and stop worker processes by the scaling rule.

Every ``POLL_S`` it reads what the scaling gauges read (``NeedReader``, one home for
it: carpool/backend/need_gauges.py), counts the workers it started that have not
registered yet as loading (the rule then holds them, and does not double again for
the same surge), and lets ``Scaler`` (carpool/stack/scaling.py) decide. Each change
is one line on `carpool up`'s output and in ``<state dir>/scaling.log``: from how
many to how many workers, and why (the model, the rule's reason and its inputs).
While workers it started are not serving yet, it tells admission when they will
(carpool/backend/coming.py), so a surge is not refused for capacity seconds away.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from carpool.backend.coming import Coming
from carpool.backend.connection import connect
from carpool.backend.keys import Keys
from carpool.backend.need_gauges import NeedReader, NeedSnapshot
from carpool.backend.queue import Queue
from carpool.backend.registry import Registry
from carpool.core.errors import BackendUnavailable
from carpool.core.settings import load_settings
from carpool.scheduling.need import ModelLoad
from carpool.stack.localstack import Stack
from carpool.stack.scaling import Decision, PoolWorker, Scaler, wish

log = logging.getLogger(__name__)

#: How often the pool is sized: a scrape's cost (a peek, a registry read, the leases),
#: and a surge waits at most this long for its first extra worker.
POLL_S = 1.0


def pool_of(stack_workers: list[str], snap: NeedSnapshot
            ) -> tuple[list[PoolWorker], int, list[str]]:
    """Our workers as the rule sees them, how many have not registered yet, and those
    not serving yet (unregistered or loading)."""
    entries = {w.worker.partition("@")[0]: w for w in snap.live}
    busy = {name.partition("@")[0] for name in snap.busy}
    pool, unregistered, starting = [], 0, []
    for name in stack_workers:
        entry = entries.get(name)
        unregistered += entry is None
        if entry is None or entry.loading:
            starting.append(name)
        pool.append(PoolWorker(name, int(name.removeprefix("worker")),
                               idle=name not in starting and name not in busy))
    return pool, unregistered, starting


class Autoscaler:
    def __init__(self, stack: Stack, say: Callable[[str], None], *,
                 scaler: Scaler | None = None, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        settings = load_settings(stack.env)
        self.client = connect(settings.redis_url, cluster=settings.redis_cluster)
        keys = Keys(settings.key_prefix)
        self.reader = NeedReader(self.client, keys, Queue(self.client, keys),
                                 Registry(self.client, keys), settings.catalogue,
                                 settings.cold_start_s)
        self.coming = Coming(self.client, keys)
        #: When each worker not serving yet was started (or first seen starting).
        self._spawned: dict[str, float] = {}
        self.models = set(settings.worker_models) or {s.name for s in settings.catalogue}
        self.stack = stack
        self.scaler = scaler or Scaler(stack.bounds, settings.scale_hold_down_s)
        self.say = say
        self.poll_s = poll_s
        self.clock = clock
        self.log_path = Path(stack.log_dir) / "scaling.log"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="carpool-autoscaler",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        self.client.close()

    def _run(self) -> None:
        problem = ""  # said once, not every second while it lasts
        while not self._stopping.wait(self.poll_s):
            try:
                self.tick()
                problem = ""
            except BackendUnavailable as exc:
                if not problem:
                    self._tell(f"scale   Redis unavailable, the pool stays as it is: {exc}")
                problem = "redis"
            except Exception as exc:  # noqa: BLE001 — the pool must keep being sized
                log.exception("autoscaler")
                if problem != repr(exc):
                    self._tell(f"scale   sizing failed, the pool stays as it is: {exc!r}")
                problem = repr(exc)

    def tick(self) -> Decision:
        snap = self.reader.snapshot()
        pool, unregistered, starting = pool_of(list(self.stack.workers), snap)
        loads = {model: dataclasses.replace(load, loading=load.loading + unregistered)
                 for model, load in snap.loads.items() if model in self.models}
        wanted, why = wish(loads)
        decision = self.scaler.decide(self.clock(), wanted, why, pool)
        if self._stopping.is_set():
            return decision
        notes: list[str] = []
        started = [self.stack.spawn_worker(notes) for _ in range(decision.start)]
        now_s = self.clock()
        self._spawned.update((name, now_s) for name in started)
        self._say_coming(loads, [*starting, *started], now_s)
        for name in decision.stop:
            self.stack.retire_worker(name)
        if started or decision.stop:
            what = (f"starting {', '.join(started)}" if started
                    else f"stopping {', '.join(decision.stop)} (warm shutdown)")
            self._tell(f"scale   {len(pool)} -> {decision.target} workers, {what}: "
                       f"{decision.why}")
        for note in notes:
            self._tell(note)
        return decision

    def _say_coming(self, loads: Mapping[str, ModelLoad], starting: list[str],
                    now_s: float) -> None:
        """Admission counts the workers not serving yet from when they will (the last
        of them: its start plus the model's cold start), model by model."""
        for name in [n for n in self._spawned if n not in starting]:
            del self._spawned[name]  # serving (or gone): a restart starts its clock anew
        for name in starting:
            self._spawned.setdefault(name, now_s)  # one we did not start: seen now
        for model, load in loads.items():
            # A worker late by a whole cold start (waiting for a GPU, failing to load)
            # is no longer counted on: admission must not lean on capacity that stalls.
            ready_in_ms = [load.cold_start_ms - 1000 * (now_s - self._spawned[name])
                           for name in starting]
            due = [ms for ms in ready_in_ms if ms > -load.cold_start_ms]
            if due:
                self.coming.say(model, len(due), round(max(due)))

    def _tell(self, line: str) -> None:
        self.say(line)
        with open(self.log_path, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
