"""Results pushed to the web with their completion, so a poll needs no Redis read.

Most result polls arrive after their job ended (an asynchronous client fetches
when it gets round to it), so each would be one Redis round trip, and round trips
are most of Redis's CPU per job. Instead complete.lua publishes, on the results
channel, the views of the jobs it wrote, built by the worker (it knows every
field but the completion time) and kept by the script only for the jobs it did
write (fenced like the write itself). Each web process keeps what it hears for a
short while (web/results/waiters.py) and answers polls from it.

Messages (one per batch, or per deletion):

    done <t_done ms>\\n<batch JSON>\\n<job JSON>\\n<job JSON>...
    del <id> <id>...

A job JSON holds the record's fields as strings (``view_from_record`` reads it like
a parsed record) plus ``id``. JSON never holds a raw newline, so lines frame the jobs. A
result over ``PUSH_MAX_BYTES`` is not pushed: its poll reads Redis, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from carpool.core.jobs import ClaimedJob, JobView, Outcome, view_from_record

#: Largest result (or error) pushed with its completion, in bytes of JSON: every web
#: process receives every pushed result, so big ones are read on demand instead.
PUSH_MAX_BYTES = 16 * 1024


def job_blob(job: ClaimedJob | None, claimed_ms: int, outcome: Outcome, payload: str,
             timings: str, model: str) -> str:
    """The pushed fields of one job, or "" when it is not pushed: its payload is too big,
    or it is not the claim's job (the script refuses its write anyway)."""
    if job is None or len(payload) > PUSH_MAX_BYTES:
        return ""
    fields = {"id": outcome.id, "status": "failed" if outcome.failed else "done",
              "error" if outcome.failed else "result": payload, "timings": timings,
              "model": model, "t_admit": str(job.admit_ms), "t_claim": str(claimed_ms),
              "attempts": str(job.attempts)}
    if job.owner:
        fields["owner"] = job.owner
    return json.dumps(fields, separators=(",", ":"))


#: How ``job_blob`` starts each job's JSON (its first field is the id), so a web process
#: can tell which job a line is without parsing it.
_ID_HEAD = '{"id":"'


@dataclass(frozen=True)
class PushedJob:
    """One job of a results message. Every web process hears every job, and asks for
    few of them (a poll reaches one process): its view is built only when asked for."""

    id: str
    line: str  # its job JSON
    t_done: str
    batch: str  # the batch JSON

    def view(self) -> JobView:
        """Raises ValueError (or KeyError, TypeError) on a line that is not a job's JSON."""
        fields = json.loads(self.line)
        if fields.pop("id") != self.id:
            raise ValueError(f"a pushed job's id is not the {self.id!r} that its line starts with")
        fields["t_done"], fields["batch"] = self.t_done, self.batch
        return view_from_record(self.id, fields)


@dataclass(frozen=True)
class Pushed:
    """One message of the results channel: final jobs, or ids whose record is gone."""

    jobs: tuple[PushedJob, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def views(self) -> tuple[JobView, ...]:
        """Every job's view, built now (tests; the web builds each on demand)."""
        return tuple(job.view() for job in self.jobs)


def parse(message: str) -> Pushed:
    """Raises ValueError (or KeyError) on a message that is not one of the two kinds; a
    job whose JSON is broken raises only once its view is built."""
    head, _, rest = message.partition("\n")
    kind, _, arg = head.partition(" ")
    if kind == "del":
        return Pushed(deleted=tuple(arg.split()))
    if kind != "done":
        raise ValueError(f"unknown results message {head[:40]!r}")
    t_done = str(int(arg))
    batch, *lines = rest.split("\n")
    return Pushed(jobs=tuple(PushedJob(_id_of(line), line, t_done, batch) for line in lines))


def _id_of(line: str) -> str:
    if line.startswith(_ID_HEAD):
        end = line.find('"', len(_ID_HEAD))
        if end > 0:
            return line[len(_ID_HEAD):end]
    job_id = json.loads(line)["id"]  # another writer's field order
    if not isinstance(job_id, str):
        raise TypeError(f"a pushed job's id is {type(job_id).__name__}, not a string")
    return job_id
