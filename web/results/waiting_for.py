"""What a queued job waits for, in its document, when no live worker serves its model.

``GET /result/<id>`` of a queued job adds ``waiting_for``: ``{"state", "reason"}``,
the registry's view of the model (carpool/backend/registry.py, cached a few seconds,
so no Redis round trip of its own): "loading" while a live worker is still loading
it; "refused" when every live worker that tried refused it (the job fails at the
refusing worker's next heartbeat: worker/shell/refusal_watch.py); "no worker" when no
worker is live at all (it starts on queue depth). A model that a live worker serves
adds nothing: the job is next in line.
"""

from __future__ import annotations

from typing import Any

from carpool.backend.refused_models import first_refusal, refusal_message
from carpool.backend.registry import RegistryCache
from carpool.core.jobs import JobStatus, JobView


def waiting_for(models: RegistryCache, view: JobView, grace_s: float) -> dict[str, Any]:
    """``{"waiting_for": ...}`` for a queued job of a model no live worker serves; else {}."""
    if view.status is not JobStatus.QUEUED:
        return {}
    found = models.availability(view.model)
    if found.state == "loading":
        reason = f"a live worker is still loading model {view.model!r}"
        if found.refused:
            reason += (f"; {first_refusal(found)}; queued jobs fail unless a worker serves "
                       f"it within {grace_s:g} s")
    elif found.state == "refused":
        reason = f"{refusal_message(view.model, found)}; queued jobs fail at once"
    elif found.state == "no worker":
        reason = (f"no live worker serves model {view.model!r} yet: the job waits for one "
                  "to start")
    else:
        return {}
    return {"waiting_for": {"state": found.state, "reason": reason}}
