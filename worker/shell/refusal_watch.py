"""A refusing worker fails the queued jobs of a model nobody will run.

Jobs of a model can be queued before any worker said it cannot load it (they were
admitted while a worker was still loading it, or while no worker was live: start-up,
a restart, scale from zero). After each heartbeat (worker/shell/presence.py) a worker
looks at the registry for each model it refused: once every live worker that tried
it refused it, none serving it or still loading it, its queued jobs end "failed" at
once (carpool/backend/refused_models.py). While another live worker is still loading it,
they wait ``grace_s`` as this worker saw it, counted from the first beat that saw the
refusal, for that worker to serve it.

The beat runs right after the worker publishes a refusal, and again on every beat
while the refusal holds, so a job admitted by a web whose view of the registry was
a few seconds old is failed at the next beat: none waits for a model nobody runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from carpool.backend.refused_models import RefusedJobs, failed_message
from carpool.backend.registry import Availability, Registry, availability
from carpool.core.catalogue import Catalogue

log = logging.getLogger(__name__)


class RefusalWatch:
    """``tick(refused)`` once per heartbeat, with the worker's refusals so far; returns
    the jobs it failed."""

    def __init__(self, registry: Registry, jobs: RefusedJobs, catalogue: Catalogue,
                 grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.jobs = jobs
        self.catalogue = catalogue
        self.grace_s = grace_s
        self.clock = clock
        #: model -> when this worker first saw it refused while another worker was still
        #: loading it (monotonic s)
        self._since: dict[str, float] = {}

    def tick(self, refused: Mapping[str, str]) -> int:
        if not refused:
            return 0  # a worker that serves all it tried never reads the registry
        live = self.registry.live()
        failed = 0
        for model in refused:
            found = availability(live, model)
            if self._due(model, found):
                failed += self._fail(model, found)
        return failed

    def _due(self, model: str, found: Availability) -> bool:
        """Whether the queued jobs of ``model`` fail now."""
        if found.state != "loading" or not found.refused:
            self._since.pop(model, None)
            return found.state == "refused"
        now_s = self.clock()
        return now_s - self._since.setdefault(model, now_s) >= self.grace_s

    def _fail(self, model: str, found: Availability) -> int:
        n = self.jobs.fail_queued(self.catalogue.get(model),
                                  failed_message(model, found, self.grace_s))
        if n:
            why = ("a worker still loading it did not serve it within the grace"
                   if found.loading_by else "every live worker refused it")
            log.warning("failed %d queued jobs of model %r: %s", n, model, why)
        return n
