"""Where the load goes: a stack of our own per policy, or a stack someone else runs.

A ``Target`` is driven either over HTTP (the whole path: web tier, Redis,
workers) or directly into Redis (the workers alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from carpool.bench.arrivals import Arrival
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.direct import run_direct
from carpool.bench.policies import Policy
from carpool.bench.records import JobRecord
from carpool.bench.stack import Stack, StackSpec
from carpool.bench.workload import SYNTHETIC
from carpool.core.settings import Settings, load_settings

TRANSPORTS = ("http", "redis")


@dataclass(frozen=True)
class Target:
    label: str
    transport: str
    base_url: str = ""
    settings: Settings | None = None
    #: The analytical limit of the workers behind it, jobs/s (None: unknown).
    limit_per_s: float | None = None
    model: str = SYNTHETIC
    #: Each simulated client gives up this long after its job's scheduled arrival (0: never).
    client_timeout_s: float = 0.0
    protocol: str = "poll"  # how each job travels over http (carpool.bench.client.PROTOCOLS)

    def drive(self, arrivals: Sequence[Arrival], nonce: str, grace_s: float,
              tick: Callable[[], None]) -> list[JobRecord]:
        if self.transport == "redis":
            assert self.settings is not None, "the redis transport needs the stack's settings"
            return run_direct(arrivals, self.settings, nonce, model=self.model,
                              grace_s=grace_s, tick=tick)
        opts = HttpOptions(self.base_url, model=self.model, grace_s=grace_s,
                           client_timeout_s=self.client_timeout_s, protocol=self.protocol)
        return run_http(arrivals, opts, nonce, tick)


@dataclass(frozen=True)
class TargetSpec:
    transport: str
    #: A running stack's web tier; empty: start a stack per policy.
    url: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: A running stack's key prefix, for the redis transport against it.
    key_prefix: str = ""
    workers: int = 1
    web_workers: int | None = None
    cost_ms: tuple[float, float] = (20.0, 1.0)
    min_depth: int = 0
    bin_name: str = "small"
    client_timeout_s: float = 0.0
    protocol: str = "poll"


@contextmanager
def open_target(spec: TargetSpec, policy: Policy, workdir: Path,
                label: str = "") -> Iterator[Target]:
    """The target for ``policy``: our own fresh stack, or the one at ``spec.url``."""
    if spec.transport not in TRANSPORTS:
        raise ValueError(f"transport {spec.transport!r} is not one of {TRANSPORTS}")
    if spec.url or spec.key_prefix:
        settings = load_settings({"CARPOOL_REDIS_URL": spec.redis_url,
                                  "CARPOOL_KEY_PREFIX": spec.key_prefix or "carpool"})
        yield Target("external", spec.transport, spec.url, settings,
                     client_timeout_s=spec.client_timeout_s, protocol=spec.protocol)
        return
    stack_spec = StackSpec(policy, spec.redis_url, workers=spec.workers,
                           web=spec.transport == "http", web_workers=spec.web_workers,
                           cost_ms=spec.cost_ms, min_depth=spec.min_depth)
    with Stack(stack_spec, workdir) as stack:
        model = stack.settings.catalogue.get(SYNTHETIC)
        limit = policy.limit_per_s(model, spec.bin_name, spec.cost_ms) * spec.workers
        yield Target(label or policy.name, spec.transport, stack.base_url, stack.settings,
                     limit, client_timeout_s=spec.client_timeout_s, protocol=spec.protocol)
