"""The rollouts in Redis (carpool/core/rollouts.py has the rules): one hash per model,
``{p.s}:rollout:<model>``, written by ``PUT``/``DELETE /models/<m>/rollout`` and read
by every web process at most ``ROLLOUT_REFRESH_S`` old (``RolloutCache``).

A change is rare and made by an operator: it reads the hash, applies the pure rule and
writes the whole hash back in one ``MULTI`` under ``WATCH`` (as bulk batches move,
docs/architecture.md), so two concurrent changes never interleave. A retiring
version's queued and running jobs are counted at one instant (``pinned.lua``); once it
counts as retired, it is unloaded as the repository API unloads a model, once per
retirement, so its workers free it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import redis

from carpool.backend.args import PinnedArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.backend.repository import Repository
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import BackendUnavailable
from carpool.core.rollouts import RETIRE_SETTLE_MS, ROLLOUT_REFRESH_S, Rollout
from carpool.core.script_args import argv
from carpool.core.shards import shard

#: The hash field of a retiring version: ``retire:<v>`` -> when it was retired (ms).
RETIRE_FIELD = "retire:"
#: The field of a version's ``{p.s}:mstats:<m@v>`` hash naming the retirement (when it
#: was retired, ms) whose end unloaded it: a load after that is the operator's, kept.
UNLOADED_RETIREMENT_FIELD = "retired_unload"


def rollout_from(h: Mapping[str, str]) -> Rollout:
    """The state a rollout hash holds (an empty hash: no rollout)."""
    return Rollout(version=h.get("version", ""), percent=float(h.get("percent") or 0),
                   shadow=h.get("shadow", ""),
                   shadow_percent=float(h.get("shadow_percent") or 0),
                   retiring={k[len(RETIRE_FIELD):]: int(v) for k, v in h.items()
                             if k.startswith(RETIRE_FIELD)})


def fields_of(rollout: Rollout) -> dict[str, str]:
    fields = {f"{RETIRE_FIELD}{v}": str(t) for v, t in rollout.retiring.items()}
    if rollout.version:
        fields.update(version=rollout.version, percent=repr(rollout.percent))
    if rollout.shadow:
        fields.update(shadow=rollout.shadow, shadow_percent=repr(rollout.shadow_percent))
    return fields


class RolloutStore:
    """Read and change the models' rollouts; every Redis error is ``BackendUnavailable``."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._pinned = load_script(client, "pinned")
        self.repository = Repository(client, keys)

    def read(self, models: Sequence[str]) -> dict[str, Rollout]:
        """Each of ``models``' rollout, in one round trip."""
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model in models:
                pipe.hgetall(self.keys.rollout(model))
            rows = pipe.execute()
        return {m: rollout_from(cast(Mapping[str, str], h)) for m, h in zip(models, rows,
                                                                            strict=True)}

    def update(self, model: str, change: Callable[[Rollout, int], Rollout]) -> Rollout:
        """Apply ``change(current, Redis's now in ms)`` and store its answer, atomically
        against any other change; its errors propagate, nothing written."""
        key = self.keys.rollout(model)
        now_ms = self.now_ms()  # Redis's clock, as the drain's settle time reads it

        def step(pipe: Any) -> Rollout:
            after = change(rollout_from(pipe.hgetall(key)), now_ms)
            pipe.multi()
            pipe.delete(key)
            if not after.is_empty():
                pipe.hset(key, mapping=fields_of(after))
            return after

        with redis_errors():
            return cast(Rollout, self.client.transaction(cast(Any, step), key,
                                                         value_from_callable=True))

    def holding_key(self, models: Sequence[str], key_digest: str) -> str | None:
        """The first of ``models`` (catalogue names) that holds an idempotency key."""
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model in models:
                pipe.exists(self.keys.idempotency(model, key_digest))
            found = pipe.execute()
        return next((m for m, n in zip(models, found, strict=True) if n), None)

    def now_ms(self) -> int:
        with redis_errors():
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def pinned(self, spec: ModelSpec) -> tuple[int, int]:
        """(queued, running) jobs of ``spec`` (a catalogue name: one version), at one instant."""
        tag = shard(spec.name)
        keys = [self.keys.leases(tag), *(self.keys.bin(spec.name, b.name) for b in spec.bins)]
        with redis_errors():
            queued, running = self._pinned(keys=keys, args=argv(PinnedArgs(
                self.keys.claim_prefix(tag))))
        return int(queued), int(running)

    def drain_state(self, spec: ModelSpec, retired_ms: int, now_ms: int) -> dict[str, Any]:
        """A retiring version as ``GET /models`` shows it: ``draining`` while a job of it
        is queued or running, or a web process may still admit one (RETIRE_SETTLE_MS);
        then ``retired``, and unloaded (``unload_retired``)."""
        queued, running = self.pinned(spec)
        retired = now_ms - retired_ms >= RETIRE_SETTLE_MS and queued == running == 0
        if retired:
            self.unload_retired(spec, retired_ms)
        return {"version": spec.version, "retired_at_ms": retired_ms, "queued": queued,
                "running": running, "state": "retired" if retired else "draining"}

    def unload_retired(self, spec: ModelSpec, retired_ms: int) -> bool:
        """Unload a retired version (POST /v2/repository/models/<m@v>/unload's way: its
        workers stop claiming it and free it), once per retirement: whether this call
        did. Two processes doing it at once unload once (model_state.lua)."""
        key = self.keys.model_stats(spec.name)
        with redis_errors():
            done = self.client.hget(key, UNLOADED_RETIREMENT_FIELD)
        if done is not None and int(done) == retired_ms:
            return False
        self.repository.unload(spec.name)
        with redis_errors():
            self.client.hset(key, UNLOADED_RETIREMENT_FIELD, str(retired_ms))
        return True


class RolloutCache:
    """One web process's view of every model's rollout, reread at most every
    ``refresh_s``; ``forget`` makes the next read fresh (after this process's change)."""

    def __init__(self, store: RolloutStore, models: Sequence[str],
                 refresh_s: float = ROLLOUT_REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.models = list(models)
        self.refresh_s = refresh_s
        self.clock = clock
        self._state: dict[str, Rollout] = {}
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def get(self, model: str) -> Rollout:
        now = self.clock()
        with self._lock:
            fresh = self._read_at is not None and now - self._read_at < self.refresh_s
            if not fresh:
                self._read_at = now  # one reader refreshes; the others use the last view
        if not fresh:
            try:
                self._state = self.store.read(self.models)
            except BackendUnavailable:  # the admission that follows answers 503 on its own
                if not self._state:  # never read: the next job tries again
                    self.forget()
        return self._state.get(model) or Rollout()

    def forget(self) -> None:
        with self._lock:
            self._read_at = None
