"""Which models the live workers serve, and which they refused (and why).

Each worker publishes, with a heartbeat (heartbeat.lua), the models it serves, those
it could not load, with the reason, and those it is still loading (from before its
first model loads until its batch loop starts, and during each load the repository API
asks for: carpool/backend/repository.py); an entry lapses when its worker stops
renewing it. The web reads the whole registry at most once per ``REFRESH_S`` (a
cache, never a Redis round trip per request) and applies one rule:

    a model that no live worker serves or is still loading, and at least one live
    worker refused, is refused at submit (503, with the worker's reason); a model
    that a live worker is still loading is queued (202), and so is a model with no
    live worker at all: scale from zero (KEDA) starts workers on queue depth.

The entry also carries what the scaling rule (carpool/backend/need_gauges.py) needs of
a worker: each bin's fitted cost t(n) = a + b·n and, per model, its cold start (process
start to first batch), once measured.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from carpool.backend.args import HeartbeatArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import Keys
from carpool.core.errors import BackendUnavailable, ModelRefused
from carpool.core.script_args import argv, keys_of
from carpool.scheduling.batching import Cost

#: A worker renews its entry this often...
HEARTBEAT_S = 5.0
#: ...and it holds this long: three missed beats before a worker counts as gone.
HEARTBEAT_TTL_MS = 15_000
#: The web rereads the registry at most this often for admission (a few seconds of
#: staleness is fine there; the repository API reads it fresh).
REFRESH_S = 2.0


@dataclass(frozen=True)
class WorkerModels:
    """One live worker's entry."""

    worker: str
    served: tuple[str, ...]
    refused: Mapping[str, str]  # model -> reason
    #: Tried, neither served nor refused yet: the worker is loading (or calibrating) them.
    loading: tuple[str, ...] = ()
    #: Per model: seconds from this worker's process start to its first batch.
    cold_start_s: Mapping[str, float] = field(default_factory=dict)
    #: Per (model, bin): the cost model fitted so far (bins without one are left out).
    costs: Mapping[tuple[str, str], Cost] = field(default_factory=dict)
    #: Per model it may serve: the repository generation it has acted on
    #: (carpool/backend/repository.py).
    generations: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Availability:
    """What the live workers say about one model."""

    served_by: int
    refused: Mapping[str, str]  # worker -> reason
    loading_by: int = 0

    @property
    def state(self) -> str:
        """"served"; "loading" (none serves it, a live worker is still loading it);
        "refused" (by every live worker that tried, none still loading it); or
        "no worker"."""
        if self.served_by:
            return "served"
        if self.loading_by:
            return "loading"
        return "refused" if self.refused else "no worker"

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "served_by": self.served_by,
                "loading_by": self.loading_by,
                "refused": [{"worker": w, "reason": r} for w, r in sorted(self.refused.items())]}


def availability(live: Sequence[WorkerModels], model: str) -> Availability:
    return Availability(sum(model in w.served for w in live),
                        {w.worker: w.refused[model] for w in live if model in w.refused},
                        sum(model in w.loading for w in live))


class Registry:
    """Publish and read the workers' entries; each write is one heartbeat.lua call."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._heartbeat = load_script(client, "heartbeat")

    def publish(self, worker: str, served: Sequence[str], refused: Mapping[str, str],
                loading: Sequence[str] = (), ttl_ms: int = HEARTBEAT_TTL_MS, *,
                cold_start_s: Mapping[str, float] | None = None,
                costs: Mapping[tuple[str, str], Cost] | None = None,
                generations: Mapping[str, int] | None = None) -> None:
        nested: dict[str, dict[str, list[float]]] = {}
        for (model, bin_name), cost in (costs or {}).items():
            nested.setdefault(model, {})[bin_name] = [round(cost.a_ms, 3), round(cost.b_ms, 4)]
        doc = json.dumps({"served": list(served), "refused": dict(refused),
                          "loading": list(loading), "cold_start_s": dict(cold_start_s or {}),
                          "costs": nested, "generations": dict(generations or {})})
        with redis_errors():
            self._heartbeat(keys=keys_of(HeartbeatArgs, workers=self.keys.workers),
                            args=argv(HeartbeatArgs(worker, ttl_ms, doc)))

    def withdraw(self, worker: str) -> None:
        """Drop the worker's entry at once (a clean stop)."""
        with redis_errors():
            self._heartbeat(keys=keys_of(HeartbeatArgs, workers=self.keys.workers),
                            args=argv(HeartbeatArgs(worker, 0, "{}")))

    def live(self) -> list[WorkerModels]:
        """The entries that have not lapsed, on Redis's clock."""
        with redis_errors():
            # Two calls, not one pipeline: a Redis Cluster pipeline refuses the keyless
            # TIME. The web reads this at most every REFRESH_S (RegistryCache).
            seconds, micros = self.client.time()
            entries = self.client.hgetall(self.keys.workers)
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        out = []
        for worker, value in cast(dict[str, str], entries).items():
            until, _, doc = value.partition(" ")
            if not until.isdigit() or int(until) < now_ms:
                continue
            try:
                parsed = json.loads(doc)
            except ValueError:
                continue  # not ours to judge: a garbled entry counts as no worker
            out.append(WorkerModels(worker, tuple(parsed.get("served") or ()),
                                    dict(parsed.get("refused") or {}),
                                    tuple(parsed.get("loading") or ()),
                                    _cold_starts(parsed.get("cold_start_s")),
                                    _costs(parsed.get("costs")),
                                    _generations(parsed.get("generations"))))
        return out


def _cold_starts(doc: object) -> dict[str, float]:
    if not isinstance(doc, dict):
        return {}
    return {str(m): float(s) for m, s in doc.items() if isinstance(s, int | float)}


def _generations(doc: object) -> dict[str, int]:
    if not isinstance(doc, dict):
        return {}
    return {str(m): g for m, g in doc.items() if isinstance(g, int)}


def _costs(doc: object) -> dict[tuple[str, str], Cost]:
    """The entry's costs; a malformed one is left out (an older or foreign worker)."""
    out: dict[tuple[str, str], Cost] = {}
    for model, bins in (doc.items() if isinstance(doc, dict) else ()):
        for bin_name, ab in (bins.items() if isinstance(bins, dict) else ()):
            if (isinstance(ab, list) and len(ab) == 2
                    and all(isinstance(v, int | float) and v >= 0 for v in ab)):
                out[(str(model), str(bin_name))] = Cost(float(ab[0]), float(ab[1]))
    return out


class RegistryCache:
    """The web's view of the registry, reread at most every ``refresh_s``."""

    def __init__(self, registry: Registry, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.refresh_s = refresh_s
        self.clock = clock
        self._live: list[WorkerModels] = []
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def live(self) -> list[WorkerModels]:
        now = self.clock()
        with self._lock:
            if self._read_at is not None and now - self._read_at < self.refresh_s:
                return self._live
            self._read_at = now  # one reader refreshes; the others use the last view
        try:
            live = self.registry.live()
        except BackendUnavailable:
            return self._live  # the admission that follows answers 503 on its own
        self._live = live
        return live

    def availability(self, model: str) -> Availability:
        return availability(self.live(), model)

    def check(self, model: str) -> None:
        """Raise ``ModelRefused`` for a model that every live worker that tried refused,
        none still loading it."""
        found = self.availability(model)
        if found.state == "refused":
            worker, reason = sorted(found.refused.items())[0]
            raise ModelRefused(f"no live worker serves model {model!r}: worker {worker} "
                               f"refused it: {reason}")
