"""Server-sent events as carpool's streams write them (docs/events.md): a parser fed
line by line, and what a client follows between reconnections. No I/O here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from carpool.client.jobdoc import FINAL

#: A stream sends a comment at least this often (the server's keep-alive is 15 s):
#: a read that waits longer means the connection is dead.
READ_TIMEOUT_S = 45.0


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
