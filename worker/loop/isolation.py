"""A claim that holds a suspect job runs that job alone.

A batch whose worker died, froze or overran its lease is retried whole once: most
deaths are not an input's fault (an out-of-memory kill, a preempted machine, a
deploy), and on a GPU one job per batch would cost the batch's whole gain. A job
that lost its worker twice (``attempts >= ISOLATE_FROM_ATTEMPT``, or on its last
attempt) may be the input that kills workers: run alone, its retries count against
it only; the rest of the claim goes straight back to the front of the bin, its
attempt refunded, and is claimed again at once — one suspect at a time, then in
full batches once no suspect is left. So a poison input fails after
``max_attempts`` while the other jobs of its first batch complete. The loop
(``BatchLoop._run_claimed``) runs such a claim with no other batch in flight, so
the pipeline never puts a suspect's crash on another batch's attempts.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from carpool.backend.leases import Leases
from carpool.core.jobs import Claim

log = logging.getLogger(__name__)


#: The attempt from which a job runs alone: its batch's worker died twice.
ISOLATE_FROM_ATTEMPT = 3


class SuspectIsolation:
    """A claim filter for ``BatchLoop``: keep the first suspect alone, hand back the rest."""

    def __init__(self, leases: Leases, max_attempts: int) -> None:
        self.leases = leases
        #: With max_attempts below it, a job's last attempt runs alone all the same.
        self.isolate_from = min(ISOLATE_FROM_ATTEMPT, max_attempts)

    def __call__(self, claim: Claim) -> Claim:
        suspect = next((j for j in claim.jobs if j.attempts >= self.isolate_from), None)
        if suspect is None or len(claim.jobs) == 1:
            return claim
        others = [j.id for j in claim.jobs if j is not suspect]
        self.leases.release(claim.token, others, refund_attempt=True)
        log.info("job %s is on attempt %d: running it alone, %d jobs handed back",
                 suspect.id, suspect.attempts, len(others))
        return replace(claim, jobs=(suspect,))
