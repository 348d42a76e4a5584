"""Jobs for the tests that drive a ``Queue``: the synthetic model with room to fill
its bins, and admitting one job of a size."""

from __future__ import annotations

import json
from dataclasses import replace

from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.queue import Queue
from carpool.core.catalogue import ModelSpec, load_catalogue
from carpool.core.jobs import new_job_id

#: How long an admitted job may wait queued; no test here comes near it.
TTL_S = 60


def synthetic(max_depth: int = 5000, max_batch: int = 32) -> ModelSpec:
    """The built-in synthetic model, every bin this deep and claiming this many at most."""
    spec = load_catalogue(None).get("synthetic")
    bins = tuple(replace(b, max_depth=max_depth, max_batch=min(max_batch, max_depth))
                 for b in spec.bins)
    return replace(spec, bins=bins)


def admit(q: Queue, spec: ModelSpec, size: int = 1, value: object = 0, *,
          body: str | None = None, **kw: object) -> str:
    """Admits one job to the bin its size lands in and returns its id. Its input is
    ``{"value": value, "size": size}`` unless ``body`` is given; ``kw`` goes to the
    ``AdmitRequest`` (owner, deadline_ms, priority...)."""
    text = json.dumps({"value": value, "size": size}) if body is None else body
    job = AdmitJob(spec.bin_for(size), new_job_id(spec.name), text)
    return single_admitted(Admissions(q.client, q.keys).admit(AdmitRequest(
        spec, (job,), queued_ttl_s=TTL_S, **kw))).id  # type: ignore[arg-type]
