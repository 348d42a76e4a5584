"""Which version each job goes to, and its shadow copy (docs/deployments.md; the rules:
carpool/core/rollouts.py, the state: carpool/backend/rollouts.py).

Every surface reads its model through ``Routing.catalogue()``: a name without a version
goes where the model's rollout sends it (a uniform draw per request, so a
``/submit/batch`` or ``/v1/embeddings`` request is served by one version whole), a
retiring version is refused (503 ``model_unavailable``), and the job's bins, job id and
admission are that version's from then on. The view of the rollouts is at most
``ROLLOUT_REFRESH_S`` old.

After admission, ``shadow`` copies a share of the jobs to the shadow version at the
bulk level (``BULK_PRIORITY``, flex tier: idle capacity, refused first), with a
deadline of ``SHADOW_DEADLINE_MS``; a copy that cannot be admitted is skipped, never
the served job's failure. Its pair is kept for the comparison (carpool/backend/shadows.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from typing import Any

from carpool.admission.urgency import BULK_PRIORITY
from carpool.backend.admissions import Admissions, AdmitJob, AdmitOutcome, AdmitRequest
from carpool.backend.rollouts import RolloutCache
from carpool.backend.shadows import ShadowBook
from carpool.core.catalogue import BinSpec, Catalogue, ModelSpec
from carpool.core.errors import CarpoolError
from carpool.core.jobs import Admitted, new_job_id
from carpool.core.rollouts import Rollout, Routed
from carpool.core.settings import Settings
from carpool.core.versions import SEPARATOR, internal_name

log = logging.getLogger(__name__)

#: A shadow copy not run within this long expires (claim.lua): it runs in idle
#: capacity or not at all, and its pair is dropped uncounted.
SHADOW_DEADLINE_MS = 600_000
#: The tier of the copies: refused first when a bin fills (carpool/admission/tiers.py).
SHADOW_TIER = "flex"


class Routing:
    """One web app's version choice and shadow copies."""

    def __init__(self, settings: Settings, cache: RolloutCache, admissions: Admissions,
                 book: ShadowBook, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.cache = cache
        self.admissions = admissions
        self.book = book
        #: The draws (tests seed it); one per request, and one per job for a shadow.
        self.rng = rng or random.Random()

    def catalogue(self, key_digest: str | None = None) -> Catalogue:
        """The catalogue as one request's jobs see it; ``key_digest``: its idempotency
        key's (carpool.core.jobs.idempotency_digest), which picks its version."""
        return Routed(self.settings.catalogue.models,
                      lambda spec, name: self._choose(spec, name, key_digest))

    def _choose(self, spec: ModelSpec, name: str, key_digest: str | None) -> ModelSpec:
        if SEPARATOR not in name and key_digest is not None:
            # A retry goes where its key is held, whatever the rollout says now (moved,
            # removed, that version retiring): admission answers it its first job.
            held = self._holding(spec, key_digest)
            if held is not None:
                return held
        rollout = self.cache.get(spec.base_name)
        if rollout.is_empty():
            return spec
        if SEPARATOR not in name:  # names no version: the model's own entry, or the rollout's
            version = self._version_for(spec, rollout, key_digest)
            # A version the catalogue lost since the PUT (a redeploy): the entry's own.
            spec = self.settings.catalogue.models.get(internal_name(spec.name, version), spec)
        rollout.check_open(spec)
        return spec

    def _holding(self, own: ModelSpec, key_digest: str) -> ModelSpec | None:
        """The version of ``own``'s model that holds an idempotency key; None when none
        does, or the model has one version (its key can be nowhere else: no read)."""
        models = self.settings.catalogue.models
        names = [own.name, *(s.name for s in models.values() if s.family == own.name)]
        if len(names) < 2:
            return None
        held = self.cache.store.holding_key(names, key_digest)
        return None if held is None else models[held]

    def _version_for(self, own: ModelSpec, rollout: Rollout, key_digest: str | None) -> str:
        if key_digest is None or not rollout.version:
            return rollout.route(own.version, self.rng.random() * 100)
        # A first keyed submit goes where its key draws: every retry draws the same.
        return rollout.route(own.version, int(key_digest[:8], 16) / 16**8 * 100)

    def shadow(self, req: AdmitRequest, outcomes: Sequence[AdmitOutcome]) -> None:
        """Copy a share of ``req``'s admitted jobs to the model's shadow version."""
        spec = req.model
        rollout = self.cache.get(spec.base_name)
        if not rollout.shadow or req.priority == BULK_PRIORITY:
            return
        target = self.settings.catalogue.models.get(internal_name(spec.base_name,
                                                                  rollout.shadow))
        if target is None or target.kind != spec.kind:
            return  # its input would not fit the shadow's kind
        copies = [(job.id, AdmitJob(found, new_job_id(target.name), job.input_json))
                  for job, outcome in zip(req.jobs, outcomes, strict=True)
                  if isinstance(outcome, Admitted) and not outcome.duplicate
                  and rollout.copies(spec.version, self.rng.random() * 100)
                  and (found := bin_for(target, job.bin)) is not None]
        if not copies:
            return
        try:
            admitted = self.admissions.admit(AdmitRequest(
                target, tuple(c for _, c in copies), self.settings.queued_ttl_s,
                SHADOW_DEADLINE_MS, BULK_PRIORITY, tier=SHADOW_TIER))
            pairs = [(served, copy.id) for (served, copy), outcome
                     in zip(copies, admitted, strict=True) if isinstance(outcome, Admitted)]
            if pairs:
                self.book.add(spec.base_name, pairs, int(time.time() * 1000))
        except CarpoolError as exc:  # a copy is never the served request's failure
            log.info("shadow copies to %s skipped: %s", target.name, exc)

    def describe(self) -> dict[str, dict[str, Any]]:
        """Each model's rollout as ``GET /models`` shows it (read fresh; the shadow pairs
        whose jobs ended are compared first); models without one are left out."""
        catalogue = self.settings.catalogue
        own = [s.name for s in catalogue if not s.family]
        store = self.cache.store
        state = store.read(own)
        self.book.compare({m: catalogue.models[m].kind for m in own})
        counts = self.book.counts(own)
        now_ms = store.now_ms() if any(r.retiring for r in state.values()) else 0
        out = {}
        for model, rollout in state.items():
            if rollout.is_empty() and not counts[model]:
                continue
            body = rollout.to_json()
            body["shadow_counts"] = {v: {"compared": n, "agreed": ok}
                                     for v, (n, ok) in counts[model].items()}
            entries = {v: catalogue.models.get(internal_name(model, v)) for v in rollout.retiring}
            entries[catalogue.models[model].version] = catalogue.models[model]
            body["retiring"] = [store.drain_state(spec, t, now_ms)
                                for v, t in sorted(rollout.retiring.items())
                                if (spec := entries.get(v)) is not None]  # a version gone
            out[model] = body
        return out


def bin_for(spec: ModelSpec, served: BinSpec) -> BinSpec | None:
    """The bin of ``spec`` that holds every input ``served`` holds: the same name, else
    the first as large; None when none is."""
    named = next((b for b in spec.bins if b.name == served.name), None)
    if named is not None and named.max_size >= served.max_size:
        return named
    return next((b for b in spec.bins if b.max_size >= served.max_size), None)
