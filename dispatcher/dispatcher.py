"""The dispatcher's loop: lease due events, deliver them on a thread pool, settle each.

Any number of dispatchers may run: hook_take.lua leases each event to one of them, so
none is delivered twice while its dispatcher lives. One that dies leaves its events
leased until their lease (one whole try and a margin) runs out; then another takes
them, and the receiver sees them again under the same ``webhook-id``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import redis

from carpool.backend.keys import BULK_HOOK_TAG, Keys
from carpool.backend.outbox import DEAD, DELIVERED, RETRYING, Delivery, Event, Outbox
from carpool.backend.queue import Queue
from carpool.core.errors import BackendUnavailable
from carpool.core.jobs import JobStatus, job_urls, view_from_record
from carpool.core.settings import Settings
from carpool.core.shards import shard
from carpool.core.versions import version_map
from carpool.core.webhook_settings import WebhookSettings
from carpool.core.wire import Family
from dispatcher.delivery import Answer, post
from dispatcher.metrics import DispatchMetrics
from dispatcher.schedule import next_wait_s
from dispatcher.signing import delivery_headers

log = logging.getLogger(__name__)

#: The longest a dispatcher blocks with nothing due: a wake token normally ends it
#: sooner; this bounds the wait for events whose wake another dispatcher took.
IDLE_WAIT_S = 2.0
#: Pause after Redis was unreachable.
BACKEND_RETRY_S = 1.0
#: How often (at most; at least once per max_age_s) a dispatcher sweeps every outbox,
#: its own shards' and any other's, for events overdue past max_age_s, and how many it
#: dead-letters per outbox each time: an outbox whose model left the catalogue is taken
#: by no dispatcher, and would stay. Finding the outboxes is a SCAN of the whole
#: keyspace: hourly keeps that to a few round trips a second at tens of millions of keys.
SWEEP_INTERVAL_S, SWEEP_MAX_N = 3600.0, 1000

Sender = Callable[[str, bytes, Mapping[str, str], WebhookSettings], Answer]


class Dispatcher:
    def __init__(self, settings: Settings, client: redis.Redis, *, sender: Sender = post,
                 metrics: DispatchMetrics | None = None) -> None:
        self.hooks = settings.webhooks
        keys = Keys(settings.key_prefix)
        self.outbox = Outbox(client, keys)
        self.queue = Queue(client, keys, version_map(settings.catalogue))
        # The shards' outboxes, and the batches' (their events: batch.completed, ...).
        self.tags = [BULK_HOOK_TAG, *sorted({shard(spec.name) for spec in settings.catalogue})]
        self.sender = sender
        self.metrics = metrics or DispatchMetrics()
        self._free = threading.Semaphore(self.hooks.concurrency)
        self._slot_freed = threading.Event()
        self.pool = ThreadPoolExecutor(self.hooks.concurrency, thread_name_prefix="carpool-hook")

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set; then finish the tries in flight."""
        next_sweep = time.monotonic()
        while not stop.is_set():
            try:
                if time.monotonic() >= next_sweep:
                    self.sweep()
                    next_sweep = time.monotonic() + min(SWEEP_INTERVAL_S,
                                                        self.hooks.max_age_s)
                self.step()
            except BackendUnavailable as exc:
                log.warning("Redis unavailable (%s); retrying in %.0f s", exc, BACKEND_RETRY_S)
                stop.wait(BACKEND_RETRY_S)
        self.pool.shutdown(wait=True)
        self.outbox.close()

    def step(self) -> int:
        """Take what is due from every shard (as many as free slots), start each try,
        and block until more may be due; returns the events started."""
        started, wait_s = 0, IDLE_WAIT_S
        for tag in self.tags:
            free = self._acquire_free()
            if not free:
                break
            handed = 0
            try:  # a Redis failure here must not keep the slots: every one not handed on
                taken = self.outbox.take(tag, len(free), self.hooks.lease_ms)
                for event, body in zip(taken.events, self._bodies(taken.events), strict=True):
                    self.pool.submit(self._try, event, body)
                    handed += 1
            finally:
                for _ in range(len(free) - handed):
                    self._free.release()
            started += handed
            if taken.next_due_ms is not None:
                wait_s = min(wait_s, max(0.0, (taken.next_due_ms - taken.now_ms) / 1000))
        if started == 0:
            if self._all_busy():
                self._slot_freed.wait(IDLE_WAIT_S)
                self._slot_freed.clear()
            elif wait_s > 0:
                self.outbox.wait(self.tags, wait_s)
        return started

    def sweep(self) -> int:
        """Dead-letter the events of every outbox overdue past max_age_s (bounded per
        outbox and call: hook_expire.lua); returns how many."""
        expired = sum(self.outbox.expire(tag, self.hooks.max_age_s, SWEEP_MAX_N)
                      for tag in self.outbox.every_outbox())
        if expired:
            log.warning("%d webhook events dead-lettered: no dispatcher took them within "
                        "%g s", expired, self.hooks.max_age_s)
            self.metrics.deliveries.labels("dead").inc(expired)
        return expired

    def _acquire_free(self) -> list[None]:
        free: list[None] = []
        while self._free.acquire(blocking=False):
            free.append(None)
        return free

    def _all_busy(self) -> bool:
        if self._free.acquire(blocking=False):
            self._free.release()
            return False
        return True

    def _bodies(self, events: Sequence[Event]) -> list[str]:
        """Each event's POST body: the one its first settled try sent (kept with the event,
        so every try of one webhook-id carries the same body, the result included after
        the record expired); else the job's document as a client reads it (without its
        webhook state, which changes with every try), and the event; one round trip."""
        if not events:
            return []
        fresh = [e for e in events if not e.body and e.family is Family.JOB]
        rows = iter(self.queue.read_records([e.job_id for e in fresh]) if fresh else [])
        out = []
        for event in events:
            if event.body:
                out.append(event.body)
                continue
            if event.family is Family.BULK:
                out.append(bulk_event_body(event))
                continue
            row = next(rows)
            doc: dict[str, Any]
            if row and "status" in row:
                view = view_from_record(event.job_id, row, self.queue.versions)
                if (event.event == "running" and view.status is JobStatus.RUNNING
                        and view.started_ms is None):
                    # claim.lua writes no record, only the event, stamped with the
                    # claim's time: the started_at a stream shows (docs/events.md).
                    view = replace(view, started_ms=event.t_ms)
                doc = view.to_json()
                doc.pop("webhook", None)
            else:  # the record expired before its event went out: what is known
                doc = {"id": event.job_id, "status": event.event,
                       "urls": job_urls(event.job_id)}
            doc["event"] = event.event
            out.append(json.dumps(doc, separators=(",", ":")))
        return out

    def _try(self, event: Event, body: str) -> None:
        try:
            self._deliver(event, body)
        except Exception:  # one event's bug must not stop the pool; its lease lapses
            log.exception("delivering %s failed", event.webhook_id)
        finally:
            self._free.release()
            self._slot_freed.set()

    def _deliver(self, event: Event, body: str) -> None:
        now_s = time.time()
        headers = delivery_headers(self.hooks.secret_for(event.owner), event.webhook_id,
                                   body, now_s)
        answer = self.sender(event.url, body.encode(), headers, self.hooks)
        attempts = event.delivery.attempts + 1
        done_s = time.time()
        if answer.ok:
            outcome, state, delay_s = DELIVERED, DELIVERED, 0.0
            self.metrics.latency.observe(max(0.0, done_s - event.t_ms / 1000))
        elif answer.refused:
            outcome, state, delay_s = "refused", DEAD, 0.0
        else:
            delay_s = next_wait_s(attempts, self.hooks.retry_base_s, self.hooks.retry_max_s,
                                  answer.retry_after_s)
            too_old = done_s + delay_s - event.t_ms / 1000 > self.hooks.max_age_s
            outcome, state = ("dead", DEAD) if too_old else ("retried", RETRYING)
        delivery = Delivery(state, attempts, answer.status, answer.error, event.t_ms)
        self.metrics.deliveries.labels(outcome).inc()
        self.outbox.settle(event, "retry" if state == RETRYING else state, delivery,
                           delay_ms=int(delay_s * 1000), max_age_s=self.hooks.max_age_s,
                           body=body if state == RETRYING else "")
        if state == DEAD:
            log.warning("webhook %s dead after %d tries: %s", event.webhook_id, attempts,
                        answer.error)


def bulk_event_body(event: Event) -> str:
    """A bulk batch event's body, as OpenAI's webhooks send it: an ``event`` object naming the
    bulk batch, whose ``id`` is the ``webhook-id`` (stable per bulk batch and event)."""
    return json.dumps({"object": "event", "id": event.webhook_id, "type": event.event,
                       "created_at": event.t_ms // 1000, "data": {"id": event.job_id}},
                      separators=(",", ":"))
