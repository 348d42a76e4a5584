"""Job reads of concurrent requests, coalesced into shared round trips
(carpool/backend/coalescing.py says why and how; admissions coalesce the same way,
behind ``carpool.backend.admissions.Admissions``)."""

from __future__ import annotations

from collections.abc import Callable

from carpool.backend.coalescing import Coalescer
from carpool.backend.queue import Queue
from carpool.core.jobs import JobView


class ReadBatcher:
    """``get`` like ``Queue.get``, but concurrent calls share round trips; a final view
    this process was pushed (``pushed``: web/results/waiters.py) needs none."""

    def __init__(self, queue: Queue,
                 pushed: Callable[[str], JobView | None] = lambda _: None) -> None:
        self.queue = queue
        self.pushed = pushed
        self.calls: Coalescer[None, str, JobView | None] = Coalescer(
            lambda _, ids: queue.get_many(ids))

    def get(self, job_id: str) -> JobView | None:
        return self.pushed(job_id) or self.calls.call(None, job_id)

    def get_many(self, job_ids: list[str]) -> list[JobView | None]:
        """Several jobs: pushed views from memory, the rest in one round trip (one
        ``read.lua`` call per shard); one job goes through ``get``, shared with others."""
        if len(job_ids) == 1:
            return [self.get(job_ids[0])]
        views = [self.pushed(job_id) for job_id in job_ids]
        unread = [i for i, view in enumerate(views) if view is None]
        if unread:
            for i, view in zip(unread, self.queue.get_many([job_ids[i] for i in unread]),
                               strict=True):
                views[i] = view
        return views
