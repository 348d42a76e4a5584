"""The batching policies one run compares, each as a catalogue file (and environment)
for its workers.

A bin's batch leaves when it holds ``max_batch`` jobs or its oldest job has waited
``max_wait_ms`` — or earlier, by the worker's default adaptive rule, when waiting
for a fuller batch does not pay (docs/scheduling.md). The baselines are other limits:

    configured    the catalogue as shipped, the worker's scheduling as configured
                  (adaptive unless the environment says CARPOOL_ADAPTIVE_BATCHING=0)
    per-job       max_batch 1, max_wait_ms 0: every job runs alone, at once
    fixed-window  max_wait_ms as configured, max_batch FIXED_WINDOW_CAP, adaptive
                  batching off: below saturation a batch never fills, so it leaves
                  only when its window (opened by its first job) closes, holding
                  whatever came
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from carpool.core.catalogue import BinSpec, ModelSpec

#: A cap the window-only policy reaches only under a backlog: 8× the configured batch.
FIXED_WINDOW_CAP = 256


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    #: Environment of this policy's workers, over the bench's own.
    env: Mapping[str, str] = field(default_factory=dict)
    #: The model's max_queue_ms under this policy (None: the catalogue's).
    max_queue_ms: int | None = None

    def bins(self, spec: ModelSpec, min_depth: int = 0) -> tuple[BinSpec, ...]:
        """``spec``'s bins under this policy; depth raised to ``min_depth`` (a drain's N)."""
        out = []
        for b in spec.bins:
            if self.name == "per-job":
                b = replace(b, max_batch=1, max_wait_ms=0)
            elif self.name == "fixed-window":
                b = replace(b, max_batch=FIXED_WINDOW_CAP)
            out.append(replace(b, max_depth=max(b.max_depth, min_depth, b.max_batch)))
        return tuple(out)

    def limit_per_s(self, spec: ModelSpec, bin_name: str, cost_ms: tuple[float, float]) -> float:
        """The analytical limit of one worker on one bin: max_batch / (a + b · max_batch)."""
        b = next(x for x in self.bins(spec) if x.name == bin_name)
        a_ms, per_job_ms = cost_ms
        return b.max_batch / ((a_ms + per_job_ms * b.max_batch) / 1000.0)


POLICIES = {
    p.name: p
    for p in (
        Policy("configured", "the catalogue's max_batch and max_wait_ms"),
        Policy("per-job", "max_batch 1: one job per model call"),
        Policy("depth-only", "the catalogue's batching, admission by max_depth alone "
               "(max_queue_ms 0: no refusal by predicted wait)", max_queue_ms=0),
        Policy("fixed-window", f"leave when the window closes (cap {FIXED_WINDOW_CAP})",
               env={"CARPOOL_ADAPTIVE_BATCHING": "0"}),
    )
}


def policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


def write_config(path: Path, spec: ModelSpec, bins: tuple[BinSpec, ...],
                 max_queue_ms: int | None = None) -> Path:
    """A CARPOOL_CONFIG file that replaces ``spec``'s bins (format: carpool.core.catalogue)."""
    lines = [f"# written by carpool bench for model {spec.name!r}"]
    if max_queue_ms is not None:
        lines += [f"[models.{spec.name}]", f"max_queue_ms = {max_queue_ms}"]
    for b in bins:
        lines += [
            f"[[models.{spec.name}.bins]]",
            f'name = "{b.name}"',
            f"max_size = {b.max_size}",
            f"max_batch = {b.max_batch}",
            f"max_wait_ms = {b.max_wait_ms}",
            f"max_depth = {b.max_depth}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path
