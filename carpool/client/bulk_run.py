"""``map``'s bookkeeping, shared by both clients: which inputs still need sending,
which refused items to retry, which jobs to poll. No I/O here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from carpool.client.errors import ApiError
from carpool.client.handle import Job
from carpool.client.jobdoc import JobDoc
from carpool.client.protocol import BATCH_INPUTS, Call, RetryPolicy, batch_call, item_error


class BulkRun:
    """Inputs of one ``map`` call, each ending as a Job (or a raised error)."""

    def __init__(self, model: str, inputs: Sequence[Any], options: Mapping[str, Any]) -> None:
        self.model = model
        self.inputs = list(inputs)
        self.options = options
        self.jobs: list[JobDoc | None] = [None] * len(self.inputs)
        self.unsent = list(range(len(self.inputs)))
        self.refused: list[ApiError] = []
        self.tries = 0

    def calls(self, wait_s: float, caller_timeout_s: float | None = None
              ) -> list[tuple[list[int], Call]]:
        """One /submit/batch call per chunk of the inputs not admitted yet; the server
        is told the caller waits ``caller_timeout_s`` more (X-Carpool-Timeout)."""
        chunks = [self.unsent[i:i + BATCH_INPUTS]
                  for i in range(0, len(self.unsent), BATCH_INPUTS)]
        self.unsent, self.refused = [], []
        self.tries += 1
        return [(chunk, batch_call(self.model, [self.inputs[i] for i in chunk], wait_s,
                                   self.options, caller_timeout_s)) for chunk in chunks]

    def take(self, chunk: Sequence[int], reply: Mapping[str, Any]) -> None:
        for i, item in zip(chunk, reply["jobs"], strict=True):
            if "id" in item:
                self.jobs[i] = Job.from_doc(item)
            else:
                self.unsent.append(i)
                self.refused.append(item_error(item))

    def retry_delay_s(self, policy: RetryPolicy) -> float | None:
        """Seconds before refused items are sent again; None when all are in. Raises
        the first refusal that is not worth retrying (or once retries are spent)."""
        if not self.unsent:
            return None
        delays = [policy.delay_s(self.tries, exc) for exc in self.refused]
        for exc, delay in zip(self.refused, delays, strict=True):
            if delay is None:
                raise exc
        return max(d for d in delays if d is not None)

    def pending(self) -> list[tuple[int, JobDoc]]:
        """(index, job) of the admitted jobs that are not final yet."""
        return [(i, job) for i, job in enumerate(self.jobs) if job is not None and not job.final]

    def results(self) -> list[Any]:
        """Each input's result in order; raises ``JobFailed`` for the first that failed."""
        return [job.outcome() for job in self.jobs if job is not None]
