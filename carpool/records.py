"""A job's record in Redis: one string per job, and its input in a key of its own.

A record is a header line of tab-separated fields, then a newline and the payload
(the result JSON of a done job, the error message of one that failed, expired or
was cancelled; nothing while it waits or runs). The input lives in ``{p.s}:in:<id>``
from admission until the job ends, so a read of the record never carries it.

One string and no field names, rather than a hash: each field of a hash costs Redis
its argument, its listpack entry and its line in the AOF on every write, and the
result's TTL a second command; a string is written whole, with its TTL, by one
``SET ... EX`` (docs/benchmarks.md, "Redis CPU per job"). The Lua scripts build and
parse the same layout (``carpool/lua/record.lua``); a test checks the two agree.

Header fields, in order (``HEAD``; empty means the default: no deadline, priority 0,
no owner, no idempotency key, and, for the timings, not reached):

- ``status``: queued, done, failed, expired, cancelled (a running job's record says
  queued: it is running when a claim holds it and it is out of its bin);
- ``attempts``: the runs started before the current claim (queued), or in all (ended);
- ``t_admit`` (ms), ``deadline`` (ms), ``owner`` (the API key's digest): what a claim
  reads, first, so it reads no further;
- ``score`` (µs, its place in the bin), ``model``, ``bin``, ``priority``, ``digest``
  (the input's, with an idempotency key), ``idem`` (that key, dropped with the job);
- once ended (``ENDED``): ``t_claim``, ``t_done`` (ms), ``timings`` (the worker's JSON)
  and ``batch`` (the batch JSON, naming the worker).

Every field but the payload is a name, a number, a hex digest or a JSON text that
``json.dumps`` wrote, so none holds a tab or a newline.
"""

from __future__ import annotations

from typing import Final

import redis

#: The header fields of every record, in order.
HEAD: Final = ("status", "attempts", "t_admit", "deadline", "owner", "score", "model", "bin",
               "priority", "digest", "idem")
#: The fields an ended record adds after them.
ENDED: Final = ("t_claim", "t_done", "timings", "batch")
#: Where the payload goes in a parsed record, by status.
_PAYLOAD: Final = {"done": "result", "failed": "error", "expired": "error",
                   "cancelled": "error"}


def parse(record: str) -> dict[str, str]:
    """The record's fields by name, those left empty omitted (so a missing field
    means its default, as with ``dict.get``), and the payload as ``result`` or
    ``error`` by its status."""
    head, _, payload = record.partition("\n")
    values = head.split("\t")
    fields = {name: v for name, v in zip(HEAD + ENDED, values, strict=False) if v}
    where = _PAYLOAD.get(fields.get("status", ""))
    if where is not None and (payload or where == "result"):
        fields[where] = payload
    return fields


def build(fields: dict[str, str | int], payload: str = "") -> str:
    """A record from its fields by name (what ``parse`` answers), for tests and tools
    that write one by hand; the scripts build their own."""
    names = HEAD + ENDED if any(f in fields for f in ENDED) else HEAD
    unknown = set(fields) - set(names) - {"result", "error"}
    if unknown:
        raise ValueError(f"not record fields: {sorted(unknown)}")
    head = "\t".join(str(fields.get(name, "")) for name in names)
    if fields.get("status", "queued") == "queued":  # a queued record is its head alone
        return head
    body = payload or str(fields.get("result", fields.get("error", "")))
    return f"{head}\n{body}"


def read(client: redis.Redis, job_key: str) -> dict[str, str] | None:
    """The record at ``job_key``, parsed; None when there is none."""
    row = client.get(job_key)
    return parse(str(row)) if row is not None else None


def update(client: redis.Redis, job_key: str, **changes: str | int) -> None:
    """Change some fields of the record at ``job_key`` by hand (tests, an operator's
    repair), keeping its TTL. Not atomic: not for a record the queue may be writing."""
    fields: dict[str, str | int] = dict(read(client, job_key) or {})
    fields.update(changes)
    client.set(job_key, build(fields), keepttl=True)


def input_key(job_key: str) -> str:
    """The key of a job's input, from its record's key: ``{p.s}:job:<id>`` →
    ``{p.s}:in:<id>`` (the same hash tag, so the same slot)."""
    tag_end = job_key.index("}:job:")
    return f"{job_key[:tag_end]}}}:in:{job_key[tag_end + len('}:job:'):]}"
