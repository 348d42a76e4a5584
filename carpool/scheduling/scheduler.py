"""A worker's scheduler: the state around the pure decision, one per batching loop.

It holds, per bin, the live limits (retunable from Celery remote control), the
fitted cost model, the arrival rate, the SLO's cap on max_batch, how often the
bin was passed over, and its recent batch sizes; it turns each peek into a
``carpool.scheduling.batching.decide`` call and each finished batch into fitting. The
simulator (carpool.sim) drives this same class with a fake clock. Its methods
are safe to call from Celery's control thread while the loop runs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.jobs import BinState
from carpool.scheduling.batching import MAX_BYPASS, BinView, Cost, Go, Limits, Wait, decide
from carpool.scheduling.costmodel import CostModel
from carpool.scheduling.rates import RateMeter
from carpool.scheduling.slo import BatchCap, keep_up_batch

BinKey = tuple[str, str]

#: Arrival rates average about the last second: a burst shows within a few batches.
ARRIVAL_TAU_MS = 1_000
ARRIVAL_MIN_AGE_MS = 200
#: Batch sizes kept per bin for inspection.
RECENT_BATCHES = 32
#: What `tune` may change, and the type each takes.
TUNABLE = {"max_batch": int, "max_wait_ms": int, "adaptive": bool, "paused": bool,
           "p99_target_ms": int}


@dataclass
class _Bin:
    base: Limits
    limits: Limits
    base_p99_target_ms: int
    p99_target_ms: int
    cost: CostModel
    arrivals: RateMeter = field(
        default_factory=lambda: RateMeter(ARRIVAL_TAU_MS, ARRIVAL_MIN_AGE_MS))
    cap: BatchCap = field(default_factory=BatchCap)
    bypassed: int = 0
    #: Of those passes, the ones for a bin due later (rule 4).
    overtaken: int = 0
    #: When the first of those passes was, ms (None: not passed over since chosen).
    first_pass_ms: int | None = None
    #: The bin's depth when it was last chosen: a backlog when it held two batches.
    depth_at_go: int = 0
    #: Whether the worker had been waiting (not busy) when the bin was last chosen.
    held_at_go: bool = False
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    def effective(self) -> Limits:
        return replace(self.limits, max_batch=self.cap.limit(self.limits.max_batch))


class Scheduler:
    """Decides which bin goes next for one worker, and learns from each batch."""

    def __init__(
        self, specs: Iterable[ModelSpec], *, adaptive: bool = True,
        cost_seeds: Mapping[BinKey, Cost] | None = None, max_bypass: int = MAX_BYPASS,
    ) -> None:
        self.max_bypass = max_bypass
        self.adaptive = adaptive
        self._bins: dict[BinKey, _Bin] = {}
        self._now_ms = 0
        self._waited = True  # the last decision was a Wait: the worker was idle
        self._lock = threading.Lock()
        for spec in specs:
            self.add(spec, cost_seeds or {})

    def add(self, spec: ModelSpec, cost_seeds: Mapping[BinKey, Cost]) -> None:
        """Serve ``spec``'s bins from the next decision on (a model loaded at run time)."""
        with self._lock:
            for b in spec.bins:
                key = (spec.name, b.name)
                base = Limits(b.max_batch, b.max_wait_ms, adaptive=self.adaptive)
                self._bins[key] = _Bin(base, base, spec.p99_target_ms, spec.p99_target_ms,
                                       CostModel.seeded(cost_seeds.get(key), b.max_batch))

    def remove(self, model: str) -> None:
        """Serve none of ``model``'s bins from the next decision on (it was unloaded)."""
        with self._lock:
            for key in [k for k in self._bins if k[0] == model]:
                del self._bins[key]

    @property
    def bins(self) -> list[BinKey]:
        return list(self._bins)

    def limits(self, key: BinKey) -> Limits:
        """The limits in force for this bin now (max_batch after the SLO's cap)."""
        with self._lock:
            return self._bins[key].effective()

    def all_limits(self) -> dict[BinKey, Limits]:
        """``limits`` of every bin, at one instant."""
        with self._lock:
            return {key: b.effective() for key, b in self._bins.items()}

    def scan_sizes(self, keys: Sequence[BinKey]) -> list[int]:
        """How many jobs of each bin a peek should look at: its next batch."""
        return [self.limits(k).max_batch for k in keys]

    def decide(self, now_ms: int, states: Sequence[BinState]) -> Go | Wait:
        """The decision for this peek; counts a passed-over bin toward rule 4."""
        with self._lock:
            self._now_ms = now_ms
            views = []
            for s in states:
                b = self._bins[(s.model, s.bin)]
                b.arrivals.update(now_ms, s.admitted)
                since = now_ms if b.first_pass_ms is None else b.first_pass_ms
                views.append(BinView(s, b.effective(), b.cost.cost(),
                                     b.arrivals.per_ms(now_ms), b.bypassed, b.overtaken,
                                     now_ms - since))
            decision = decide(now_ms, views, self.max_bypass)
            passed_keys = decision.passed_over if isinstance(decision, Go) else ()
            for s in states:  # not passed over while due: its passes in a row end
                if (s.model, s.bin) not in passed_keys:
                    b = self._bins[(s.model, s.bin)]
                    b.bypassed, b.overtaken, b.first_pass_ms = 0, 0, None
            if isinstance(decision, Go):
                chosen = self._bins[(decision.model, decision.bin)]
                chosen.depth_at_go = next(s.depth for s in states
                                          if (s.model, s.bin) == (decision.model, decision.bin))
                chosen.held_at_go = self._waited
                for key in decision.passed_over:
                    passed = self._bins[key]
                    passed.bypassed += 1
                    passed.overtaken += key in decision.overtaken
                    if passed.first_pass_ms is None:
                        passed.first_pass_ms = now_ms
            self._waited = isinstance(decision, Wait)
            return decision

    def observe(self, model: str, bin_name: str, size: int, runtime_ms: float,
                latencies_ms: list[float]) -> None:
        """One batch finished: fit the cost model, and let the SLO cap move."""
        with self._lock:
            b = self._bins[(model, bin_name)]
            b.cost.observe(size, runtime_ms)
            b.recent.append(size)
            ceiling = b.limits.max_batch
            floor = keep_up_batch(b.cost.cost(), b.arrivals.per_ms(self._now_ms), ceiling)
            b.cap.observe(latencies_ms, b.p99_target_ms, ceiling, floor,
                          left_behind=b.depth_at_go >= 2 * size, held=b.held_at_go)

    def tune(self, model: str, bin_name: str | None = None, *, reset: bool = False,
             **changes: Any) -> list[dict[str, Any]]:
        """Change limits of a model's bins (or one bin), from the next decision on.

        ``reset`` first restores the catalogue's limits. Raises ConfigError for an
        unknown model, bin or setting, and ValueError for a value out of range.
        """
        unknown = set(changes) - set(TUNABLE)
        if unknown:
            raise ConfigError(f"cannot tune {sorted(unknown)}; tunable: {sorted(TUNABLE)}")
        keys = [k for k in self._bins if k[0] == model and bin_name in (None, k[1])]
        if not keys:
            raise ConfigError(f"this worker serves no bin {bin_name or '*'!r} of {model!r}")
        with self._lock:
            for key in keys:
                b = self._bins[key]
                if reset:
                    b.limits, b.p99_target_ms = b.base, b.base_p99_target_ms
                fields = {k: v for k, v in changes.items() if k != "p99_target_ms"}
                b.limits = replace(b.limits, **fields)  # Limits validates the values
                if "p99_target_ms" in changes:
                    b.p99_target_ms = max(0, int(changes["p99_target_ms"]))
                b.cap.reset()
        return [e for e in self.snapshot() if (e["model"], e["bin"]) in keys]

    def cost_of(self, key: BinKey) -> Cost | None:
        """The bin's fitted batch time, claim to results written (a pipelined worker's
        wait for the batch ahead included; None: none known, measured or seeded). The
        claim expires a job whose deadline comes before its batch would end by it: not
        padded like the leave-by's allowance, so a job is given up on the expected
        time, not on a bound."""
        with self._lock:
            return self._bins[key].cost.cost()

    def costs(self) -> dict[BinKey, Cost]:
        """Each bin's fitted cost, where one is known (the registry entry carries them)."""
        with self._lock:
            fitted = {key: b.cost.cost() for key, b in self._bins.items()}
        return {key: cost for key, cost in fitted.items() if cost is not None}

    def snapshot(self) -> list[dict[str, Any]]:
        """Each bin's limits, fitted cost, arrival rate and recent batches, as JSON."""
        with self._lock:
            out = []
            for (model, bin_name), b in self._bins.items():
                cost = b.cost.cost()
                out.append({
                    "model": model, "bin": bin_name,
                    "max_batch": b.limits.max_batch, "max_wait_ms": b.limits.max_wait_ms,
                    "adaptive": b.limits.adaptive, "paused": b.limits.paused,
                    "p99_target_ms": b.p99_target_ms,
                    "effective_max_batch": b.effective().max_batch,
                    "last_p99_ms": b.cap.last_p99_ms,
                    "cost_ms": None if cost is None else {
                        "a": round(cost.a_ms, 3), "b": round(cost.b_ms, 4),
                        "batches": b.cost.batches},
                    "arrivals_per_s": round(b.arrivals.per_ms(self._now_ms) * 1000, 2),
                    "recent_batch_sizes": list(b.recent),
                })
            return out
