"""Server-sent events as carpool's streams write them (docs/events.md): a parser fed
line by line, and what a client follows between reconnections. No I/O here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from carpool.client.errors import ClientError
from carpool.client.jobdoc import FINAL
from carpool.client.protocol import RetryPolicy

#: A stream sends a comment at least this often (the server's keep-alive is 15 s):
#: a read that waits longer means the connection is dead.
READ_TIMEOUT_S = 45.0
#: A stream that ends sooner than this without an event is not the server's stream at
#: work (that lasts CARPOOL_MAX_WAIT_S, or ends at a final event): such ends in a row
#: count as failed tries, so a quick empty answer is not reconnected to forever.
QUICK_END_S = 1.0


@dataclass(frozen=True)
class Event:
    """One event: ``event`` is the job's status (or ``error``), ``data`` the job document
    (or the error), ``id`` what a reconnection sends as ``Last-Event-ID``."""

    id: str
    event: str
    data: Mapping[str, Any]


class SseParser:
    """The text/event-stream format, one line at a time (the WHATWG rules carpool uses:
    ``id``, ``event``, ``data`` and ``retry`` fields, comments, a blank line ends an event)."""

    def __init__(self) -> None:
        self.last_id = ""
        self.retry_ms: int | None = None
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> Event | None:
        """The event that ``line`` completes, if any."""
        if line == "":
            if not self._data:
                self._event = ""
                return None
            raw, self._data = "\n".join(self._data), []
            name, self._event = self._event or "message", ""
            try:
                data = json.loads(raw)
            except ValueError:
                data = {"raw": raw}
            return Event(self.last_id, name, data if isinstance(data, dict) else {"raw": data})
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id" and "\0" not in value:
            self.last_id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None


@dataclass
class Following:
    """The jobs one ``events()`` call follows, across reconnections."""

    ids: Sequence[str]
    last_id: str = ""
    statuses: dict[str, str] = field(default_factory=dict)

    def path(self) -> str:
        if len(self.ids) == 1:
            return f"/result/{self.ids[0]}/events"
        return "/events?ids=" + ",".join(self.ids)

    def headers(self) -> dict[str, str]:
        return {"Accept": "text/event-stream",
                **({"Last-Event-ID": self.last_id} if self.last_id else {})}

    def saw(self, event: Event) -> None:
        self.last_id = event.id or self.last_id
        job_id = event.data.get("id")
        if isinstance(job_id, str):
            self.statuses[job_id] = event.event

    @property
    def finished(self) -> bool:
        return all(self.statuses.get(job_id) in FINAL for job_id in self.ids)


@dataclass
class Reconnects:
    """When ``events()`` connects again to a stream that ended or was cut before every
    job was final: never sooner than the server's ``retry:`` or the policy's first
    backoff, backing off after connections that told nothing (refused, cut, 429 or 503,
    or ended at once without an event), and giving up after ``policy.attempts`` of them
    in a row."""

    policy: RetryPolicy
    url: str
    #: The server's ``retry:``, kept across connections as an EventSource keeps it.
    retry_ms: int | None = None
    #: Connections in a row that told nothing.
    barren: int = 0

    def delay_s(self, told: bool, lasted_s: float, retry_ms: int | None,
                error: ClientError | None) -> float:
        """Seconds to wait before the next connection; raises ``error`` (or says the
        stream keeps ending empty) when it is time to give up."""
        self.retry_ms = retry_ms if retry_ms is not None else self.retry_ms
        fruitless = not told and (error is not None or lasted_s < QUICK_END_S)
        self.barren = self.barren + 1 if fruitless else 0
        if error is not None:
            # A stream is a GET, resumed where the client is (Last-Event-ID): one cut
            # mid-read (a web restarted, a reset) is safe to open again.
            wanted = self.policy.delay_s(max(self.barren, 1), error,  # Retry-After included
                                         safe_again=True)
            if wanted is None:
                raise error
        elif self.barren >= self.policy.attempts:
            raise ClientError(f"the event stream at {self.url} ended {self.barren} times "
                              "in a row without an event: is something else answering?")
        else:
            wanted = self.policy.backoff_s(self.barren) if self.barren else 0.0
        return max(wanted, (self.retry_ms or 0) / 1000, self.policy.first_backoff_s)
