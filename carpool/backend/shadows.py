"""Shadow copies' comparisons (docs/deployments.md): each copy is kept as a pair
``"<served id> <copy id>"`` in ``{p.s}:shadow-pairs:<model>``, scored by when it was
made; once both jobs ended, the pair is compared by the model's kind
(carpool.core.rollouts.agrees) and counted in ``{p.s}:shadow:<model>``
(``compared:<v>``, ``agreed:<v>``, ``v`` the shadow's version).

Comparing is a read of both results: it runs when the counts are read (a ``/metrics``
scrape, ``GET /models``), at most ``COMPARE_PER_READ`` pairs a model each time, oldest
first, never per request. A pair is counted by whoever takes it out of the set
(``ZREM`` answers 1 once), so web processes comparing at once never count one twice.
A pair whose job is gone, or ended other than ``done``, is dropped uncounted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import cast

import redis
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from carpool.backend.connection import redis_errors
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import JobStatus, JobView
from carpool.core.rollouts import agrees
from carpool.core.versions import split

log = logging.getLogger(__name__)

#: Pairs compared per model per read: each costs reading two results.
COMPARE_PER_READ = 256
#: A pair older than this is dropped when a copy is added: its copy has expired
#: (SHADOW_DEADLINE_MS) and its result is gone, or nobody read the counts meanwhile.
PAIR_KEEP_MS = 3_600_000
#: Pairs kept per model at most, the oldest dropped first: the set stays bounded
#: even when nobody reads the counts.
PAIRS_CAP = 10_000


class ShadowBook:
    """Pairs of served jobs and their shadow copies, and the comparisons' counts."""

    def __init__(self, queue: Queue, keys: Keys) -> None:
        self.queue = queue
        self.client: redis.Redis = queue.client
        self.keys = keys

    def add(self, model: str, pairs: Sequence[tuple[str, str]], now_ms: int) -> None:
        """Keep ``(served id, copy id)`` pairs of ``model`` (its own name) to compare."""
        key = self.keys.shadow_pairs(model)
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(key, {f"{served} {copy}": now_ms for served, copy in pairs})
            pipe.zremrangebyscore(key, "-inf", now_ms - PAIR_KEEP_MS)
            pipe.zremrangebyrank(key, 0, -PAIRS_CAP - 1)
            pipe.pexpire(key, PAIR_KEEP_MS)
            pipe.execute()

    def compare(self, kinds: Mapping[str, str]) -> int:
        """Compare the pairs whose jobs both ended, for each model of ``kinds`` (its
        kind): how many were counted."""
        models = list(kinds)
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model in models:
                pipe.zrange(self.keys.shadow_pairs(model), 0, COMPARE_PER_READ - 1)
            listed = cast(list[list[str]], pipe.execute())
        pairs = [(m, *p.split(" ", 1)) for m, found in zip(models, listed, strict=True)
                 for p in found]
        if not pairs:
            return 0
        ids = [job_id for _, served, copy in pairs for job_id in (served, copy)]
        views = dict(zip(ids, self.queue.get_many(ids), strict=True))
        done: list[tuple[str, str, str, bool | None]] = []  # model, member, version, agreed
        for model, served, copy in pairs:
            a, b = views[served], views[copy]
            if _ended(a) and _ended(b):
                done.append((model, f"{served} {copy}", _version(b),
                             _agreed(kinds[model], a, b)))
        if not done:
            return 0
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model, member, _, _ in done:
                pipe.zrem(self.keys.shadow_pairs(model), member)
            taken = pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            for (model, _, version, agreed), mine in zip(done, taken, strict=True):
                if mine and agreed is not None and version:
                    pipe.hincrby(self.keys.shadow_counts(model), f"compared:{version}", 1)
                    pipe.hincrby(self.keys.shadow_counts(model), f"agreed:{version}",
                                 int(agreed))
            pipe.execute()
        return sum(1 for (*_, agreed), mine in zip(done, taken, strict=True)
                   if mine and agreed is not None)

    def counts(self, models: Sequence[str]) -> dict[str, dict[str, tuple[int, int]]]:
        """Per model, per shadow version: (compared, agreed)."""
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model in models:
                pipe.hgetall(self.keys.shadow_counts(model))
            rows = cast(list[dict[str, str]], pipe.execute())
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for model, row in zip(models, rows, strict=True):
            versions = {k.split(":", 1)[1] for k in row}
            out[model] = {v: (int(row.get(f"compared:{v}", 0)), int(row.get(f"agreed:{v}", 0)))
                          for v in sorted(versions)}
        return out


def _ended(view: JobView | None) -> bool:
    return view is None or view.status.is_final


def _version(view: JobView | None) -> str:
    return "" if view is None else view.model_version or split(view.model)[1]


def _agreed(kind: str, served: JobView | None, copy: JobView | None) -> bool | None:
    """None: not comparable (a job gone, or ended other than done)."""
    if served is None or copy is None or {served.status, copy.status} != {JobStatus.DONE}:
        return None
    return agrees(kind, served.result, copy.result)


class ShadowCounters(Collector):
    """``carpool_shadow_compared_total`` and ``carpool_shadow_agreed_total`` by model and
    shadow version, read from Redis when scraped (after comparing what ended): every
    web process reports the same values, so read them with ``max by``."""

    def __init__(self, book: ShadowBook, kinds: Mapping[str, str]) -> None:
        self.book = book
        self.kinds = dict(kinds)

    def collect(self) -> Iterator[Metric]:
        compared = CounterMetricFamily("carpool_shadow_compared", "Shadow copies compared "
                                       "with the job they copied", labels=("model", "version"))
        agreed = CounterMetricFamily("carpool_shadow_agreed", "Shadow copies whose result "
                                     "agreed with the served one (the kind's rule)",
                                     labels=("model", "version"))
        try:
            self.book.compare(self.kinds)
            counts = self.book.counts(list(self.kinds))
        except BackendUnavailable as exc:  # a scrape never fails for Redis: no samples
            log.warning("shadow counts not read: %s", exc)
            counts = {}
        for model, versions in counts.items():
            for version, (n, ok) in versions.items():
                compared.add_metric([model, version], n)
                agreed.add_metric([model, version], ok)
        if compared.samples:  # no shadow ever compared: no series, as for a model never run
            yield compared
            yield agreed
