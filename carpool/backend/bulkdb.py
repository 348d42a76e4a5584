"""Files' metadata and bulk batches' documents in Redis (their bytes are in the file store).

A bulk batch (OpenAI's /v1/batches) is one hash (``Keys.bulk``) that the web
creates and cancels and the feeder moves on; each change of state that races
another process (a cancel against the feeder's next step) is a ``WATCH``ed
transaction, so a status never goes backwards. The lines' progress is two keys
beside it: which jobs each admitted line has (``bulk_jobs``) and which lines are
stored (``bulk_stored``, a bitmap), changed only together with the counts, in one
``MULTI``.
All keys carry the ``{p}`` tag: one slot, so the transactions hold on a cluster.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import redis

from carpool.backend.connection import redis_errors
from carpool.backend.keys import BULK_HOOK_TAG, Keys
from carpool.backend.outbox import Delivery, add_event
from carpool.core.bulk import FINAL, STAMPS, BulkStatus, BulkView
from carpool.core.wire import Family

#: The webhook event of each final status (OpenAI's names; docs/batches.md).
FINAL_EVENTS = {BulkStatus.COMPLETED: "batch.completed", BulkStatus.FAILED: "batch.failed",
                BulkStatus.EXPIRED: "batch.expired", BulkStatus.CANCELLED: "batch.cancelled"}

#: A listed record: a file's fields, or a bulk batch's view.
Row = TypeVar("Row")


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def new_bulk_id() -> str:
    return "batch_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Page(Generic[Row]):
    """One page of a listing, newest first, as OpenAI lists: ``has_more`` past it."""

    items: list[Row]
    has_more: bool


class BulkDb:
    """Typed reads and writes of the file and bulk batch records."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys

    # --- files ---
    def add_file(self, meta: Mapping[str, str | int], keep_s: int) -> None:
        key = self.keys.file(str(meta["id"]))
        with redis_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(key, mapping=cast(Any, dict(meta)))
            pipe.expire(key, keep_s)
            pipe.zadd(self.keys.files(str(meta.get("owner", ""))), {str(meta["id"]): _order()})
            pipe.execute()

    def file(self, file_id: str) -> dict[str, str] | None:
        with redis_errors():
            h = self.client.hgetall(self.keys.file(file_id))
        return _decoded(h) or None

    def drop_file(self, file_id: str, owner: str) -> None:
        with redis_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(self.keys.file(file_id))
            pipe.zrem(self.keys.files(owner), file_id)
            pipe.execute()

    def list_files(self, owner: str, after: str, limit: int, purpose: str | None = None,
                   oldest_first: bool = False) -> Page[dict[str, str]]:
        """Up to ``limit`` of the owner's files after ``after``, of ``purpose`` if given;
        newest first unless ``oldest_first`` (OpenAI's ``order=asc``)."""
        return self._listing(self.keys.files(owner), after, limit, self.keys.file, _decoded,
                             lambda row: purpose in (None, row.get("purpose")), oldest_first)

    # --- bulk batches ---
    def add_bulk(self, fields: Mapping[str, str | int], keep_s: int) -> None:
        bulk_id, owner = str(fields["id"]), str(fields.get("owner", ""))
        with redis_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(self.keys.bulk(bulk_id), mapping=cast(Any, dict(fields)))
            pipe.expire(self.keys.bulk(bulk_id), keep_s)
            pipe.zadd(self.keys.bulks(owner), {bulk_id: _order()})
            pipe.sadd(self.keys.bulks_active, bulk_id)
            pipe.execute()

    def bulk(self, bulk_id: str) -> BulkView | None:
        with redis_errors():
            h = self.client.hgetall(self.keys.bulk(bulk_id))
        return BulkView.from_hash(_decoded(h)) if h else None

    def list_bulk(self, owner: str, after: str, limit: int) -> Page[BulkView]:
        return self._listing(self.keys.bulks(owner), after, limit, self.keys.bulk,
                             lambda h: BulkView.from_hash(_decoded(h)), lambda _: True)

    def active(self) -> list[str]:
        with redis_errors():
            return sorted(_s(m) for m in self.client.smembers(self.keys.bulks_active))

    def move(self, bulk_id: str, allowed_from: Sequence[BulkStatus], to: BulkStatus,
             **fields: str | int) -> bool:
        """Set status ``to`` (and ``fields``) if the status is one of ``allowed_from``;
        False, changing nothing, otherwise. Atomic against every other ``move``.

        A move to a final status of a bulk batch with a ``webhook`` adds its event to the
        bulk outbox in the same ``MULTI`` (same ``{p}`` slot), so no crash separates
        the end from its webhook; the status check makes it once per bulk batch."""
        key = self.keys.bulk(bulk_id)

        def step(pipe: Any) -> bool:
            status, webhook, owner = pipe.hmget(key, "status", "webhook", "owner")
            if status is None or BulkStatus(_s(status)) not in allowed_from:
                pipe.multi()
                return False
            pipe.multi()
            pipe.hset(key, mapping=cast(Any, {"status": to.value, **fields}))
            if to in FINAL:
                pipe.srem(self.keys.bulks_active, bulk_id)
            if to in FINAL_EVENTS and webhook:
                add_event(pipe, self.keys, Family.BULK, bulk_id, FINAL_EVENTS[to],
                          _s(owner or ""), _s(webhook))
            return True

        with redis_errors():
            return bool(self.client.transaction(cast(Any, step), key, value_from_callable=True))

    def deliveries(self, bulk_id: str) -> dict[str, Delivery]:
        """The bulk batch's webhook deliveries by event (empty before any try)."""
        with redis_errors():
            row = self.client.hgetall(self.keys.hook_state(bulk_id, BULK_HOOK_TAG))
        return {k: Delivery.from_json(v) for k, v in _decoded(row).items()}

    def set_fields(self, bulk_id: str, **fields: str | int) -> None:
        with redis_errors():
            self.client.hset(self.keys.bulk(bulk_id), mapping=cast(Any, dict(fields)))

    # --- lines ---
    def line_state(self, bulk_id: str) -> tuple[dict[int, list[str]], bytes]:
        """The admitted, not yet stored lines' job ids, and the stored bitmap."""
        with redis_errors():
            jobs = self.client.hgetall(self.keys.bulk_jobs(bulk_id))
            # Raw bytes: the client decodes replies as UTF-8, which a bitmap is not.
            stored_key = self.keys.bulk_stored(bulk_id)
            bitmap = self.client.execute_command(  # type: ignore[no-untyped-call]
                "GET", stored_key, NEVER_DECODE=True)
        return ({int(_s(k)): _s(v).split() for k, v in jobs.items()},
                bitmap if isinstance(bitmap, bytes) else b"")

    def record_admitted(self, bulk_id: str, lines: Mapping[int, list[str]]) -> None:
        with redis_errors():
            self.client.hset(self.keys.bulk_jobs(bulk_id),
                             mapping={str(i): " ".join(ids) for i, ids in lines.items()})

    def forget_admitted(self, bulk_id: str, lines: Sequence[int]) -> None:
        """Lines whose jobs are gone unstored (a result expired, Redis lost them): they
        are admitted again."""
        if lines:
            with redis_errors():
                self.client.hdel(self.keys.bulk_jobs(bulk_id), *map(str, lines))

    def record_stored(self, bulk_id: str, lines: Sequence[int], chunk: int,
                      completed: int, failed: int, on_done: Callable[[Any], None]) -> None:
        """Lines ``lines`` are in chunk ``chunk`` (already in the file store): mark them,
        count them and move the chunk counter, in one ``MULTI``; ``on_done`` adds the
        jobs' deletions to a second, plain pipeline after it."""
        key = self.keys.bulk(bulk_id)
        with redis_errors():
            pipe = self.client.pipeline(transaction=True)
            for i in lines:
                pipe.setbit(self.keys.bulk_stored(bulk_id), i, 1)
            if lines:
                pipe.hdel(self.keys.bulk_jobs(bulk_id), *map(str, lines))
            pipe.hincrby(key, "completed", completed)
            pipe.hincrby(key, "failed", failed)
            pipe.hset(key, "chunks", chunk + 1)
            pipe.execute()
            after = self.client.pipeline(transaction=False)
            on_done(after)
            after.execute()

    def drop_line_state(self, bulk_id: str, keep_s: int) -> None:
        with redis_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(self.keys.bulk_jobs(bulk_id))
            pipe.expire(self.keys.bulk_stored(bulk_id), keep_s)
            pipe.execute()

    def _listing(self, key: str, after: str, limit: int, record_key: Callable[[str], str],
                 parse: Callable[[Mapping[Any, Any]], Row], keep: Callable[[Row], bool],
                 oldest_first: bool = False) -> Page[Row]:
        """Up to ``limit`` rows newest (or oldest) first after id ``after``, those
        ``keep`` takes: each page's records read in one round trip, and read on past
        records gone (expired) or not kept, so a short page is the last and its last id
        pages on."""
        rows: list[Row] = []
        while True:
            ids = self._page_ids(key, after, limit, oldest_first)
            with redis_errors():
                pipe = self.client.pipeline(transaction=False)
                for record_id in ids[:limit]:
                    pipe.hgetall(record_key(record_id))
                found = pipe.execute()
            for i, h in enumerate(found):
                row = parse(h) if h else None
                if row is not None and keep(row):
                    rows.append(row)
                    if len(rows) == limit:
                        return Page(rows, i + 1 < len(found) or len(ids) > limit)
            if len(ids) <= limit:
                return Page(rows, False)
            after = ids[limit - 1]

    def _page_ids(self, key: str, after: str, limit: int, oldest_first: bool = False,
                  ) -> list[str]:
        """Up to ``limit + 1`` ids, newest (or oldest) first, after id ``after`` ('' =
        from the top)."""
        rank_of, ids_in = ((self.client.zrank, self.client.zrange) if oldest_first
                           else (self.client.zrevrank, self.client.zrevrange))
        with redis_errors():
            start = 0
            if after:
                rank = rank_of(key, after)
                if rank is None:
                    return []
                start = int(cast(int, rank)) + 1
            return [_s(m) for m in ids_in(key, start, start + limit)]


def _order() -> int:
    """A listing's score: creation in µs, so two made in one second keep their order."""
    return time.time_ns() // 1000


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decoded(h: Mapping[Any, Any]) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in h.items()}


def bulk_document(view: BulkView) -> dict[str, Any]:
    """The bulk batch as OpenAI's API shows it."""
    counts = view.counts
    doc: dict[str, Any] = {
        "id": view.id, "object": "batch", "endpoint": view.endpoint, "errors": view.errors,
        "input_file_id": view.input_file_id, "completion_window": view.completion_window,
        "status": view.status.value, "output_file_id": view.output_file_id,
        "error_file_id": view.error_file_id, **{name: view.stamps[name] for name in STAMPS},
        "request_counts": {"total": counts.total, "completed": counts.completed,
                           "failed": counts.failed},
        "metadata": view.metadata,
        # The model its lines name, once validation read them (OpenAI's ``model``).
        "model": view.model,
        # Not in OpenAI's batch object; OpenAI answers it on its other objects.
        "service_tier": view.service_tier,
    }
    # carpool's own: when the bulk batch ends at the rate it has gone so far, and whether
    # that is past its window (docs/batches.md).
    doc["carpool"] = {"model": view.model, "webhook": view.webhook,
                      "projected_completion_at": view.projected_at,
                      "window_at_risk": view.at_risk}
    return doc


def file_document(h: Mapping[str, str]) -> dict[str, Any]:
    """The file as OpenAI's API shows it."""
    return {"id": h["id"], "object": "file", "bytes": int(h["bytes"]),
            "created_at": int(h["created_at"]), "filename": h.get("filename", ""),
            "purpose": h["purpose"], "status": "processed", "status_details": None,
            "expires_at": int(h["expires_at"]) if h.get("expires_at") else None}
