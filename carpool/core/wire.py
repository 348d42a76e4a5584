"""The formats that cross Python <-> Lua, each encoded and decoded here only.

The Lua side of each is ``carpool/backend/lua/lib/wire.lua``; ``tests/redis/test_wire.py``
round-trips each both ways (Python-encoded, decoded by the fragment; Lua-encoded, decoded
here). The job record, the third thing both sides write, has its own pair:
``carpool/backend/records.py`` and ``lua/lib/record.lua``.

- ``HookField``: a record's ``hook`` field, what a job asked for: "<letters> <url>".
- ``OutboxEvent``: one member of an outbox zset:
  "<subject id>\\t<event>\\t<t_ms>\\t<owner>\\t<url>".
- ``CompletionHook``: one line of complete.lua's ``hooks`` argument:
  "<k>\\t<event letter>\\t<owner>\\t<hook field>".
- ``UsageLine``: one line of complete.lua's ``usage`` argument, an owner's part of a
  batch: "<owner>\\t<jobs>\\t<device_us>\\t<queue_ms>\\t<k> <device_us> <queue_ms> ...".

No field holds a tab or a newline (ids, event names, digests, numbers, and URLs that
``carpool.core.webhooks.check_url`` let through); ``encode`` refuses one that does
rather than write a member the other side would split wrongly. It lives in the core,
beside the URL's checks, so the web, the backend and the dispatcher share it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

#: Each event a job's webhook may be sent for, and its letter in the ``hook`` field
#: (the Lua scripts test the letter: lua/lib/wire.lua's WIRE_EVENTS).
EVENT_LETTERS: Final = {"running": "r", "done": "d", "failed": "f", "expired": "x",
                        "cancelled": "c"}
_EVENT_OF_LETTER: Final = {letter: event for event, letter in EVENT_LETTERS.items()}


class Family(StrEnum):
    """Whose event it is, and so which outbox holds it: a job's (its shard's outbox,
    added by the script that changes the job) or a bulk batch's (the ``{p}`` outbox,
    added by the ``MULTI`` that ends the batch: carpool/backend/bulkdb.py)."""

    JOB = "job"
    BULK = "bulk"


def _plain(*values: str) -> None:
    for value in values:
        if "\t" in value or "\n" in value:
            raise ValueError(f"a wire field holds a tab or a newline: {value[:80]!r}")


@dataclass(frozen=True)
class HookField:
    """The webhook a job asked for: its events, in ``EVENT_LETTERS``' order, and URL."""

    events: tuple[str, ...]
    url: str

    def encode(self) -> str:
        _plain(self.url)
        if " " in self.url or not self.url:
            raise ValueError(f"a hook URL is non-empty and holds no space: {self.url[:80]!r}")
        return "".join(EVENT_LETTERS[e] for e in self.events) + " " + self.url

    @classmethod
    def decode(cls, field: str) -> HookField | None:
        """None for "" (no webhook) or a field without a URL."""
        letters, sep, url = field.partition(" ")
        if not sep or not url:
            return None
        return cls(tuple(_EVENT_OF_LETTER[c] for c in letters if c in _EVENT_OF_LETTER), url)

    def wants(self, event: str) -> bool:
        return event in self.events


@dataclass(frozen=True)
class OutboxEvent:
    """One event as an outbox holds it; ``subject_id`` is a job id or a batch id."""

    subject_id: str
    event: str
    #: When it happened (ms; Redis's clock for a job's, the host's for a batch's).
    t_ms: int
    owner: str
    url: str

    def encode(self) -> str:
        _plain(self.subject_id, self.event, self.owner, self.url)
        return "\t".join((self.subject_id, self.event, str(self.t_ms), self.owner, self.url))

    @classmethod
    def decode(cls, member: str) -> OutboxEvent:
        subject_id, event, t_ms, owner, url = member.split("\t", 4)
        return cls(subject_id, event, int(t_ms), owner, url)


@dataclass(frozen=True)
class CompletionHook:
    """A job of a completed batch whose outcome's event it asked for."""

    #: The job's place among complete.lua's per-job arguments, from 1.
    k: int
    #: "done" or "failed".
    event: str
    owner: str
    #: The job's ``hook`` field, as its record holds it.
    hook: str

    def encode(self) -> str:
        _plain(self.owner, self.hook)
        return f"{self.k}\t{EVENT_LETTERS[self.event]}\t{self.owner}\t{self.hook}"


def encode_completion_hooks(hooks: Iterable[CompletionHook]) -> str:
    """complete.lua's ``hooks`` argument: one line per job, "" for none."""
    return "\n".join(h.encode() for h in hooks)


@dataclass(frozen=True)
class UsageLine:
    """One owner's part of a completed batch (complete.lua's ``usage`` argument): its
    jobs, their device time (µs) and queue time (ms) summed, and each job's own
    ``(k, device_us, queue_ms)`` (k: its place in per_job, from 1), which the script
    reads only when some job's write was refused, to sum the written ones alone."""

    owner: str
    jobs: tuple[tuple[int, int, int], ...]

    def encode(self) -> str:
        _plain(self.owner)
        if " " in self.owner:
            raise ValueError(f"an owner holds no space: {self.owner[:80]!r}")
        device_us = sum(d for _, d, _ in self.jobs)
        queue_ms = sum(q for _, _, q in self.jobs)
        each = " ".join(f"{k} {d} {q}" for k, d, q in self.jobs)
        return f"{self.owner}\t{len(self.jobs)}\t{device_us}\t{queue_ms}\t{each}"


def encode_usage(lines: Iterable[UsageLine]) -> str:
    """complete.lua's ``usage`` argument: one line per owner, "" for none."""
    return "\n".join(line.encode() for line in lines)
