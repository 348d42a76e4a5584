"""A job's record in Redis: one string per job, ``{p.s}:job:<id>``.

A record is a header line of tab-separated fields, then a newline and the payload:
the input while the job waits or runs; the result JSON of a done job, or the error
message of one that failed, expired or was cancelled. Reads for clients
(``carpool/backend/lua/read.lua``) cut a queued record at its head, so they never carry an
input, which may be a large image.

One string per job, rather than a hash and a key for the input: each field of a hash
costs Redis its argument, its listpack entry and its line in the AOF on every write,
the result's TTL a second command, and each key a lookup of its own; a string is
written whole, with its TTL, by one ``SET ... EX`` that also drops the input
(docs/benchmarks.md, "Redis CPU per job"). The Lua scripts build and parse the same
layout (``carpool/backend/lua/lib/record.lua``); tests write records on each side and read
them on the other (``tests/redis/test_records.py``).

Header fields, in order (``HEAD``; empty means the default: no deadline, priority 0,
no owner, no idempotency key, and, for the timings, not reached):

- ``status``: queued, done, failed, expired, cancelled (a running job's record says
  queued: it is running when a claim holds it and it is out of its bin);
- ``attempts``: the runs started before the current claim (queued), or in all (ended);
- ``t_admit`` (ms), ``deadline`` (ms), ``owner`` (the API key's digest): what a claim
  reads, first, so it reads no further;
- ``score`` (µs, its place in the bin), ``model``, ``bin``, ``priority``, ``digest``
  (the input's, with an idempotency key), ``idem`` (that key, dropped with the job),
  ``hook`` (the webhook asked for: the events' letters, a space, the URL;
  carpool/core/webhooks.py), last, so a script tells "none" by the byte before the
  newline;
- once ended (``ENDED``): ``t_claim``, ``t_done`` (ms), ``timings`` (the worker's JSON)
  and ``batch`` (the batch JSON: its ``id``, the claim's token; the worker; the
  model version that ran it).

Every field but the payload is a name, a number, a hex digest or a JSON text that
``json.dumps`` wrote, so none holds a tab or a newline.
"""

from __future__ import annotations

from typing import Final

import redis

#: The header fields of every record, in order.
HEAD: Final = ("status", "attempts", "t_admit", "deadline", "owner", "score", "model", "bin",
               "priority", "digest", "idem", "hook")
#: The fields an ended record adds after them.
ENDED: Final = ("t_claim", "t_done", "timings", "batch")
#: Where the payload goes in a parsed record, by status.
_PAYLOAD: Final = {"queued": "input", "running": "input", "done": "result",
                   "failed": "error", "expired": "error", "cancelled": "error"}


def parse(record: str) -> dict[str, str]:
    """The record's fields by name, those left empty omitted (so a missing field
    means its default, as with ``dict.get``), and the payload as ``input``, ``result``
    or ``error`` by its status (a queued record read for a client has no input, and
    its status may say "running": ``carpool/backend/lua/read.lua``)."""
    head, newline, payload = record.partition("\n")
    values = head.split("\t")
    fields = {name: v for name, v in zip(HEAD + ENDED, values, strict=False) if v}
    where = _PAYLOAD.get(fields.get("status", ""))
    if where is not None and newline:
        fields[where] = payload
    return fields


def parse_read(row: str) -> dict[str, str]:
    """A record as ``read.lua`` answers it: a queued one carries its place in its bin
    where the payload would be, parsed as ``position``."""
    fields = parse(row)
    if fields.get("status") == "queued" and "input" in fields:
        fields["position"] = fields.pop("input")
    return fields


def build(fields: dict[str, str | int], payload: str = "") -> str:
    """A record from its fields by name (what ``parse`` answers), for tests and tools
    that write one by hand; the scripts build their own."""
    names = HEAD + ENDED if any(f in fields for f in ENDED) else HEAD
    unknown = set(fields) - set(names) - {"input", "result", "error"}
    if unknown:
        raise ValueError(f"not record fields: {sorted(unknown)}")
    head = "\t".join(str(fields.get(name, "")) for name in names)
    where = _PAYLOAD.get(str(fields.get("status", "queued")), "error")
    return f"{head}\n{payload or fields.get(where, '')}"


def read(client: redis.Redis, job_key: str) -> dict[str, str] | None:
    """The record at ``job_key``, parsed; None when there is none."""
    row = client.get(job_key)
    return parse(str(row)) if row is not None else None


def update(client: redis.Redis, job_key: str, **changes: str | int) -> None:
    """Change some fields of the record at ``job_key`` by hand (tests, an operator's
    repair), keeping its TTL and payload. Not atomic: not for a record the queue may
    be writing."""
    fields: dict[str, str | int] = dict(read(client, job_key) or {})
    fields.update(changes)
    client.set(job_key, build(fields), keepttl=True)


def claimed(record: str) -> tuple[int, str, str]:
    """A queued record as ``claim.lua`` hands it out, whole: (the runs started before
    this claim, its admission fields from ``t_admit`` to ``idem`` as one string, its
    input). The worker hands the admission fields back with the outcome
    (``ended_parts``), so the completion never reads the queued record."""
    head, _, payload = record.partition("\n")
    _status, attempts, admission = head.split("\t", 2)
    return int(attempts or 0), admission, payload


def admission_fields(admission: str) -> tuple[int | None, str]:
    """``t_admit`` (ms; None when left empty) and ``owner`` out of a record's admission
    fields (``t_admit`` to ``hook``)."""
    t_admit, _deadline, owner, _rest = admission.split("\t", 3)
    return (int(t_admit) if t_admit else None), owner


def admission_hook(admission: str) -> str:
    """The ``hook`` field out of a record's admission fields (the last one; "" none):
    decoded by ``carpool.core.wire.HookField``."""
    return admission.rpartition("\t")[2] if admission.count("\t") >= 9 else ""


def admission_deadline_ms(admission: str) -> int | None:
    """The job's absolute ``deadline`` (ms) out of its record's admission fields; None
    when it has none (or no fields were handed out)."""
    parts = admission.split("\t", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1] else None


def admission_priority(admission: str) -> int:
    """The job's priority out of its record's admission fields (0 when empty, as a
    record writes the default, or when no fields were handed out)."""
    parts = admission.split("\t", 7)
    return int(parts[6]) if len(parts) > 6 and parts[6] else 0


def ended_parts(status: str, attempts: int, admission: str, t_claim_ms: int, timings: str,
                batch: str, payload: str) -> tuple[str, str]:
    """An ended record but for ``t_done``, in two parts: ``complete.lua`` writes
    ``head + t_done + tail``, with ``t_done`` Redis's own clock at the write."""
    return (f"{status}\t{attempts}\t{admission}\t{t_claim_ms}\t",
            f"\t{timings}\t{batch}\n{payload}")
