"""The webhook outbox: events leased to dispatchers, their delivery states, the dead.

The scripts that change a job's state add its webhook events to the shard's outbox in
the same call (carpool/backend/lua/lib/outbox.lua); a bulk batch's end adds its own in the
``MULTI`` that makes it (``add_event``). Events are carpool/core/wire.py's
``OutboxEvent``; the outbox an event is in says its ``Family``. A dispatcher leases due events
(``take``: hook_take.lua), tries each, and settles it (``settle``: hook_settle.lua):
delivered, due again later, or dead. An event leased to a dispatcher that died is due
again once its lease runs out, so every event is tried at least once more; duplicates
carry the same ``webhook-id``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster

from carpool.backend.args import HookExpireArgs, HookSettleArgs, HookTakeArgs
from carpool.backend.connection import load_script, redis_errors
from carpool.backend.keys import BULK_HOOK_TAG, Keys, family_of_tag, hook_tag
from carpool.backend.wake import ShardWaiters
from carpool.core.script_args import argv, keys_of
from carpool.core.wire import Family, OutboxEvent

#: Dead-lettered deliveries kept per shard (newest first): enough to see a pattern.
HOOK_DEAD_CAP = 10_000
#: While an event retries, its job's delivery states (and the body its retries send)
#: outlive its last possible try by a day; once delivered or dead they live as long as
#: the job's record, whose document shows them (hook_settle.lua).
STATE_TTL_MARGIN_S = 86_400
#: The state hash's field that keeps the body of a retried event, after the event's name.
BODY_FIELD_SUFFIX = ":body"

#: The wake list's cap, as lib/outbox.lua's HOOK_WAKE_CAP: one token wakes a dispatcher.
HOOK_WAKE_CAP = 16

#: The states of one event's delivery, in the job document's ``webhook.state``.
PENDING, RETRYING, DELIVERED, DEAD = "pending", "retrying", "delivered", "dead"


@dataclass(frozen=True)
class Delivery:
    """One event's delivery so far."""

    state: str = PENDING
    attempts: int = 0
    last_status: int | None = None
    last_error: str | None = None
    #: When the event happened (Redis's clock, ms).
    t_event_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Delivery:
        doc = json.loads(text)
        return cls(str(doc.get("state", PENDING)), int(doc.get("attempts", 0)),
                   doc.get("last_status"), doc.get("last_error"), int(doc.get("t_event_ms", 0)))


@dataclass(frozen=True)
class Event:
    """One webhook event as a dispatcher took it: its member (an ``OutboxEvent``), parsed,
    and whose it is (``family``: by the outbox it was taken from)."""

    member: str
    job_id: str
    event: str
    t_ms: int
    owner: str
    url: str
    delivery: Delivery = field(default_factory=Delivery)
    #: The event's score while this dispatcher holds it (Redis ms): its lease.
    leased_ms: int = 0
    #: The body its first settled try sent ("" before: read from the job's record).
    body: str = ""
    family: Family = Family.JOB

    @property
    def webhook_id(self) -> str:
        """Stable per (job, event): a receiver drops a duplicate by it."""
        return f"{self.job_id}.{self.event}"

    @classmethod
    def parse(cls, member: str, state: str = "", leased_ms: int = 0, body: str = "",
              family: Family = Family.JOB) -> Event:
        w = OutboxEvent.decode(member)
        return cls(member, w.subject_id, w.event, w.t_ms, w.owner, w.url,
                   Delivery.from_json(state) if state else Delivery(t_event_ms=w.t_ms),
                   leased_ms, body, family)


@dataclass(frozen=True)
class Taken:
    """What ``take`` leased, at Redis time ``now_ms``; ``next_due_ms``: when the earliest
    event left is due (None: none left)."""

    now_ms: int
    next_due_ms: int | None
    events: tuple[Event, ...]


class Outbox:
    """Take, settle and read webhook events; each is one script call or one read."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._take = load_script(client, "hook_take")
        self._settle = load_script(client, "hook_settle")
        self._expire = load_script(client, "hook_expire")
        self._waiters: ShardWaiters | None = None

    def take(self, tag: str, max_n: int, lease_ms: int) -> Taken:
        with redis_errors():
            reply = self._take(keys=keys_of(HookTakeArgs, outbox=self.keys.outbox(tag)),
                               args=argv(HookTakeArgs(max_n, lease_ms,
                                                      self.keys.hook_state_prefix(tag))))
        now_ms, next_due = int(reply[0]), int(reply[1])
        family = family_of_tag(tag)
        events = tuple(Event.parse(str(reply[i]), str(reply[i + 1]), now_ms + lease_ms,
                                   str(reply[i + 2]), family)
                       for i in range(2, len(reply), 3))
        return Taken(now_ms, None if next_due < 0 else next_due, events)

    def settle(self, event: Event, outcome: str, delivery: Delivery, *, delay_ms: int = 0,
               max_age_s: float = 0.0, body: str = "") -> bool:
        """Record one try (with "retry", keep ``body`` for the next ones unless an earlier
        try's is kept); False, and nothing written, when this dispatcher's lease on the
        event had lapsed (another may have taken and settled it)."""
        tag = hook_tag(event.family, event.job_id)
        dead_entry = ""
        if outcome == DEAD:
            dead_entry = json.dumps({"id": event.job_id, "event": event.event,
                                     "url": event.url, **asdict(delivery)})
        args = HookSettleArgs(event.member, event.event, outcome, delay_ms,
                              delivery.to_json(), int(max_age_s) + STATE_TTL_MARGIN_S,
                              HOOK_DEAD_CAP, dead_entry, event.leased_ms, body)
        with redis_errors():
            return bool(self._settle(
                keys=keys_of(HookSettleArgs, outbox=self.keys.outbox(tag),
                             state=self.keys.hook_state(event.job_id, tag),
                             dead=self.keys.hook_dead(tag),
                             # A bulk batch's event: its bulk hash, in the same slot.
                             record=(self.keys.bulk(event.job_id)
                                     if event.family is Family.BULK
                                     else self.keys.job(event.job_id))),
                args=argv(args)))

    def expire(self, tag: str, max_age_s: float, max_n: int) -> int:
        """Dead-letter up to ``max_n`` events of ``tag``'s outbox due more than
        ``max_age_s`` ago (no dispatcher took them); returns how many."""
        with redis_errors():
            return int(self._expire(
                keys=keys_of(HookExpireArgs, outbox=self.keys.outbox(tag),
                             dead=self.keys.hook_dead(tag)),
                args=argv(HookExpireArgs(int(max_age_s * 1000), max_n, HOOK_DEAD_CAP))))

    def deliveries(self, job_ids: Sequence[str]) -> list[dict[str, Delivery]]:
        """Each job's delivery states by event (empty before any try)."""
        if not job_ids:
            return []
        with redis_errors():
            if isinstance(self.client, RedisCluster):
                rows = [self.client.hgetall(self.keys.hook_state(i)) for i in job_ids]
            else:
                pipe = self.client.pipeline(transaction=False)
                for job_id in job_ids:
                    pipe.hgetall(self.keys.hook_state(job_id))
                rows = pipe.execute()
        return [{str(k): Delivery.from_json(str(v)) for k, v in row.items()
                 if not str(k).endswith(BODY_FIELD_SUFFIX)} for row in rows]

    def dead(self, tags: Sequence[str], n: int) -> list[dict[str, Any]]:
        """The newest ``n`` dead-lettered deliveries of each shard."""
        out: list[dict[str, Any]] = []
        with redis_errors():
            for tag in tags:
                out += [json.loads(str(x)) for x in
                        self.client.lrange(self.keys.hook_dead(tag), 0, n - 1)]
        return out

    def waiting(self, tags: Sequence[str]) -> int:
        """Events in the outboxes of ``tags``: not yet delivered nor dead."""
        with redis_errors():
            return sum(int(self.client.zcard(self.keys.outbox(t))) for t in tags)

    def every_outbox(self) -> dict[str, tuple[int, int]]:
        """Each shard's non-empty outbox, found by SCAN (those of models no longer in the
        catalogue too): tag -> (events, the earliest due time in Redis ms)."""
        out: dict[str, tuple[int, int]] = {}
        with redis_errors():
            found = [(self.keys.tag_of_outbox(str(key)), key) for key in
                     self.client.scan_iter(match=self.keys.outbox_pattern, count=1000)]
            # The bulk batches' outbox has no shard in its tag, so the pattern misses it.
            for tag, key in [*found, (BULK_HOOK_TAG, self.keys.outbox(BULK_HOOK_TAG))]:
                head = self.client.zrange(key, 0, 0, withscores=True)
                if head:
                    out[tag] = (int(self.client.zcard(key)), int(head[0][1]))
        return out

    def wait(self, tags: Sequence[str], timeout_s: float) -> bool:
        """Block until a state change added an event to one of ``tags``' outboxes, or
        ``timeout_s`` passes (on a cluster one thread per shard: carpool.backend.wake)."""
        wake = [self.keys.hook_wake(t) for t in tags]
        if isinstance(self.client, RedisCluster) and len(wake) > 1:
            if self._waiters is None:
                self._waiters = ShardWaiters(self.client, wake)
            return self._waiters.wait(timeout_s)
        with redis_errors():
            return self.client.blpop(wake, timeout=max(timeout_s, 0.01)) is not None

    def close(self) -> None:
        if self._waiters is not None:
            self._waiters.close()


def add_event(pipe: Any, keys: Keys, family: Family, subject_id: str, event: str, owner: str,
              url: str) -> None:
    """Queue on ``pipe`` (a ``MULTI`` that makes the state change) what lib/outbox.lua
    adds: the event, due at once, and a wake token. For events whose change is not a
    script call (a bulk batch's end: carpool/backend/bulkdb.py)."""
    tag = hook_tag(family, subject_id)
    t_ms = time.time_ns() // 1_000_000
    member = OutboxEvent(subject_id, event, t_ms, owner, url).encode()
    # Score 0, "due at once" whatever this host's clock says against Redis's.
    pipe.zadd(keys.outbox(tag), {member: 0})
    pipe.rpush(keys.hook_wake(tag), "1")
    pipe.ltrim(keys.hook_wake(tag), -HOOK_WAKE_CAP, -1)


def webhook_doc(deliveries: dict[str, Delivery]) -> dict[str, Any]:
    """The job document's ``webhook``: the delivery of its latest event (pending before
    any), with that event's name."""
    if not deliveries:
        return {"state": PENDING, "attempts": 0, "last_status": None, "last_error": None}
    event, d = max(deliveries.items(), key=lambda kv: kv[1].t_event_ms)
    return {"state": d.state, "attempts": d.attempts, "last_status": d.last_status,
            "last_error": d.last_error, "event": event}
