"""Where the load goes: a stack of our own per policy, or a stack someone else runs.

A ``Target`` is driven either over HTTP (the whole path: web tier, Redis,
workers) or directly into Redis (the workers alone).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from carpool.bench.arrivals import Arrival
from carpool.bench.client import HttpOptions, run_http
from carpool.bench.direct import run_direct
from carpool.bench.policies import Policy, policy
from carpool.bench.records import JobRecord
from carpool.bench.stack import Stack, StackSpec
from carpool.bench.workload import SYNTHETIC, SizeMix
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


def each_target(args: argparse.Namespace, out: Path, transport: str,
             backlog: Callable[[float], int] | None = None) -> Iterator[tuple[int, Target]]:
    """Each (policy, workers) target in turn, its stack up only while it is driven.

    ``backlog(limit)`` is the number of jobs a drain will admit at once into a
    stack whose analytical limit is ``limit`` jobs/s; its bins are made that deep.
    """
    sizes = SizeMix.parse(args.sizes)
    base = TargetSpec(transport, url=args.url, redis_url=args.redis_url,
                      key_prefix=args.key_prefix, web_workers=args.web_workers,
                      cost_ms=args.cost_ms,
                      client_timeout_s=getattr(args, "client_timeout_s", 0.0),
                      protocol=getattr(args, "protocol", "poll"))
    model = load_settings({}).catalogue.get(SYNTHETIC)
    bin_name = model.bin_for(sizes.sizes[0]).name
    for name in [n.strip() for n in args.policies.split(",") if n.strip()]:
        pol = policy(name)
        for workers in args.workers:
            label = name if len(args.workers) == 1 else f"{name} x{workers}"
            n = backlog(pol.limit_per_s(model, bin_name, args.cost_ms) * workers) if backlog else 0
            spec = replace(base, workers=workers, bin_name=bin_name, min_depth=n)
            with open_target(spec, pol, out / "stack", label) as target:
                yield n, target
            if args.url or args.key_prefix:
                return  # a running stack is one target, whatever the policies say
