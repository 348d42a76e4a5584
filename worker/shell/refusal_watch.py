"""A refusing worker fails the queued jobs of a model nobody will run.

Jobs of a model can be queued before any worker said it cannot load it (they were
admitted while no worker was live: start-up, a restart, scale from zero). On each
heartbeat (worker/shell/presence.py) a worker looks at the registry for each model
it refused; once every live worker that tried has refused it, with none serving it,
for ``grace_s`` as this worker saw it, its queued jobs end "failed"
(carpool/backend/refused_models.py). The grace starts at the first beat that sees the
refusal, so it counts from when the last server lapsed or this worker registered:
a worker still loading the model has that long to register.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from carpool.backend.refused_models import RefusedJobs, failed_message
from carpool.backend.registry import Registry, availability
from carpool.core.catalogue import Catalogue

log = logging.getLogger(__name__)


class RefusalWatch:
    """``tick()`` once per heartbeat; returns the jobs it failed."""

    def __init__(self, registry: Registry, jobs: RefusedJobs, catalogue: Catalogue,
                 refused: Mapping[str, str], grace_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.jobs = jobs
        self.catalogue = catalogue
        self.refused = tuple(refused)
        self.grace_s = grace_s
        self.clock = clock
        #: model -> when this worker first saw every live worker refuse it (monotonic s)
        self._since: dict[str, float] = {}

    def tick(self) -> int:
        if not self.refused:
            return 0  # a worker that serves all it tried never reads the registry
        live = self.registry.live()
        now_s = self.clock()
        failed = 0
        for model in self.refused:
            found = availability(live, model)
            if found.state != "refused":
                self._since.pop(model, None)
                continue
            since_s = self._since.setdefault(model, now_s)
            if now_s - since_s < self.grace_s:
                continue
            n = self.jobs.fail_queued(self.catalogue.get(model),
                                      failed_message(model, found, self.grace_s))
            if n:
                log.warning("failed %d queued jobs of model %r: every live worker refused it "
                            "for %.0f s", n, model, now_s - since_s)
            failed += n
        return failed
