"""The scaling rule's gauges, read from Redis when scraped: ``carpool_workers_needed``
and ``carpool_deadline_misses_projected``, per model (carpool/scheduling/need.py).

The web registers them on its ``/metrics`` (web/app.py): every replica reads the same
Redis state, so read them with ``max by (model)``. Nothing runs per request: a scrape
costs one peek per model (as the bin gauges' own), one ``HGETALL`` of the workers'
registry and one ``ZRANGEBYSCORE`` of each served shard's leases. Inputs, per model:

- each bin's depth, earliest deadline (or oldest admission plus ``max_queue_ms``) and
  admissions counter, from the peek; the arrival rate from that counter across scrapes
  (a decayed rate: the first scrape of a process reads none);
- each bin's cost t(n) = a + b·n, the mean of the live workers' fits (their registry
  entries carry them), kept from the last one seen once none is live;
- the cold start: the largest a live worker measured (process start to first batch),
  kept likewise; before any, ``CARPOOL_COLD_START_S``;
- the live workers that serve the model, those of them holding a lease in its shard
  (a claim's token starts with its worker's name), and those still loading it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from carpool.backend.connection import redis_errors
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.backend.registry import Registry, WorkerModels
from carpool.core.catalogue import Catalogue, ModelSpec
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import BinState
from carpool.core.shards import shard
from carpool.scheduling.batching import Cost
from carpool.scheduling.need import BinLoad, ModelLoad, workers_needed
from carpool.scheduling.rates import RateMeter

log = logging.getLogger(__name__)

#: The admission rate is averaged over about 30 s (as carpool/sim/scaling.py's): a
#: scrape every 15-30 s reaches each web process less often, and the decayed count
#: is right whatever the gap between reads.
ARRIVAL_TAU_MS = 30_000
ARRIVAL_MIN_AGE_MS = 15_000


@dataclass(frozen=True)
class NeedSnapshot:
    """One read: each model's load, the live workers' entries, and the workers holding
    an unexpired lease in any shard read (carpool up's autoscaler stops none of those)."""

    loads: dict[str, ModelLoad]
    live: list[WorkerModels]
    busy: frozenset[str]


class NeedReader:
    """Each model's ``ModelLoad`` now, from Redis; keeps rates, costs and cold starts
    across reads."""

    def __init__(self, client: redis.Redis, keys: Keys, queue: Queue, registry: Registry,
                 catalogue: Catalogue, default_cold_start_s: float) -> None:
        self.client = client
        self.keys = keys
        self.queue = queue
        self.registry = registry
        self.specs: list[ModelSpec] = list(catalogue)
        self.default_cold_start_s = default_cold_start_s
        self._bins = [(spec.name, b.name) for spec in self.specs for b in spec.bins]
        self._scan = [b.max_batch for spec in self.specs for b in spec.bins]
        self._meters = {key: RateMeter(ARRIVAL_TAU_MS, ARRIVAL_MIN_AGE_MS)
                        for key in self._bins}
        self._costs: dict[tuple[str, str], Cost] = {}
        self._cold_start_s: dict[str, float] = {}
        self._lock = threading.Lock()

    def read(self) -> dict[str, ModelLoad]:
        return self.snapshot().loads

    def snapshot(self) -> NeedSnapshot:
        now_ms, states = self.queue.peek(self._bins, self._scan)
        live = self.registry.live()
        holders = self._lease_holders(now_ms)
        with self._lock:
            for s in states:
                self._meters[(s.model, s.bin)].update(now_ms, s.admitted)
            self._remember(live)
            loads = {spec.name: self._model(spec, now_ms, [s for s in states
                                                           if s.model == spec.name],
                                            live, holders.get(shard(spec.name), set()))
                     for spec in self.specs}
        return NeedSnapshot(loads, live, frozenset().union(*holders.values()))

    def _lease_holders(self, now_ms: int) -> dict[str, set[str]]:
        """Per shard, the workers holding an unexpired lease (a token is
        ``<worker>:<hex>:<seq>``, carpool/backend/leases.py)."""
        out: dict[str, set[str]] = {}
        for tag in {shard(spec.name) for spec in self.specs}:
            with redis_errors():
                tokens = self.client.zrangebyscore(self.keys.leases(tag), now_ms, "+inf")
            out[tag] = {str(t).rsplit(":", 2)[0] for t in tokens}
        return out

    def _remember(self, live: Sequence[WorkerModels]) -> None:
        """The live workers' costs (their mean) and cold starts (their largest) replace
        those kept; a bin or model no live worker measured keeps its last."""
        fits: dict[tuple[str, str], list[Cost]] = {}
        cold: dict[str, float] = {}
        for w in live:
            for key, cost in w.costs.items():
                fits.setdefault(key, []).append(cost)
            for model, seconds in w.cold_start_s.items():
                cold[model] = max(seconds, cold.get(model, 0.0))
        for key, costs in fits.items():
            self._costs[key] = Cost(sum(c.a_ms for c in costs) / len(costs),
                                    sum(c.b_ms for c in costs) / len(costs))
        self._cold_start_s.update(cold)

    def _model(self, spec: ModelSpec, now_ms: int, states: Sequence[BinState],
               live: Sequence[WorkerModels], holders: set[str]) -> ModelLoad:
        bins, slack = [], None
        for s in states:
            b = spec.bin_named(s.bin)
            bins.append(BinLoad(s.depth, b.max_batch, self._costs.get((spec.name, s.bin)),
                                self._meters[(spec.name, s.bin)].per_ms(now_ms)))
            due = _due_ms(s, spec.max_queue_ms_of(b))
            if due is not None:
                slack = due - now_ms if slack is None else min(slack, due - now_ms)
        serving = [w for w in live if spec.name in w.served]
        return ModelLoad(
            bins, None if slack is None else float(slack),
            float(spec.default_deadline_ms or spec.max_queue_ms),
            1000.0 * self._cold_start_s.get(spec.name, self.default_cold_start_s),
            up=len(serving), busy=sum(w.worker in holders for w in serving),
            loading=sum(spec.name in w.loading for w in live))


def _due_ms(state: BinState, max_queue_ms: int) -> int | None:
    """When the bin's most urgent job is due: its deadline, else its admission plus
    ``max_queue_ms``; None for an empty bin or one without a time bound."""
    if state.depth <= 0:
        return None
    if state.earliest_deadline_ms:
        return state.earliest_deadline_ms
    if max_queue_ms > 0 and state.oldest_admit_ms is not None:
        return state.oldest_admit_ms + max_queue_ms
    return None


class NeedGauges(Collector):
    """The two gauges, per model, computed at each scrape."""

    def __init__(self, reader: NeedReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        try:
            loads = self.reader.read()
        except BackendUnavailable as exc:
            log.warning("scaling gauges left out of this scrape: %s", exc)
            return
        needed = GaugeMetricFamily(
            "carpool_workers_needed", "Workers the model needs so its queued and arriving "
            "jobs meet their deadlines (never below those holding leases or loading).",
            labels=["model"])
        misses = GaugeMetricFamily(
            "carpool_deadline_misses_projected", "Queued jobs that the workers up and "
            "loading now would finish after their deadline.", labels=["model"])
        for model, load in loads.items():
            need = workers_needed(load)
            needed.add_metric([model], need.workers)
            misses.add_metric([model], need.misses_projected)
        yield needed
        yield misses
