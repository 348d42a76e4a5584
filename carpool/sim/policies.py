"""The batching policies a simulation compares: fixed windows and adaptive, with
or without a p99 target. Each is the catalogue's model with other limits."""

from __future__ import annotations

from dataclasses import dataclass, replace

from carpool.core.catalogue import ModelSpec
from carpool.scheduling.batching import Cost

#: The "long" fixed window, as a multiple of the catalogue's.
LONG_WINDOW_FACTOR = 5


@dataclass(frozen=True)
class Policy:
    name: str
    adaptive: bool
    #: Every bin's max_wait_ms; None: the catalogue's own.
    max_wait_ms: int | None = None
    p99_target_ms: int = 0

    def apply(self, spec: ModelSpec) -> ModelSpec:
        bins = spec.bins
        if self.max_wait_ms is not None:
            bins = tuple(replace(b, max_wait_ms=self.max_wait_ms) for b in bins)
        return replace(spec, bins=bins, p99_target_ms=self.p99_target_ms)


def default_slo_ms(spec: ModelSpec, cost: Cost) -> int:
    """A p99 target worth testing: twice the longest full batch."""
    return round(2 * max(cost.ms(b.max_batch) for b in spec.bins))


def standard(spec: ModelSpec, cost: Cost, slo_ms: int | None = None) -> list[Policy]:
    """Fixed windows 0, the catalogue's and a long one; adaptive; adaptive with a p99 target."""
    default = spec.bins[0].max_wait_ms
    slo = slo_ms if slo_ms is not None else default_slo_ms(spec, cost)
    return [
        Policy("window-0", adaptive=False, max_wait_ms=0),
        Policy(f"window-{default}", adaptive=False),
        Policy(f"window-{default * LONG_WINDOW_FACTOR}", adaptive=False,
               max_wait_ms=default * LONG_WINDOW_FACTOR),
        Policy("adaptive", adaptive=True),
        Policy(f"adaptive-p99-{slo}", adaptive=True, p99_target_ms=slo),
    ]


def capacity_per_s(spec: ModelSpec, cost: Cost, bin_shares: dict[str, float],
                   workers: int) -> float:
    """Jobs/s the workers can serve at full batches, for this mix of bins."""
    seconds_per_job = sum(share * cost.ms(spec.bin_named(name).max_batch)
                          / spec.bin_named(name).max_batch / 1000.0
                          for name, share in bin_shares.items())
    return workers / seconds_per_job
