"""A job as a handle: its document as the server last described it, and the calls
that act on it through the client that made it (``refresh``, ``wait``, ``cancel``,
``events``). ``Job`` is the blocking client's, ``AsyncJob`` the asyncio one's (the
same calls, as coroutines). A handle is immutable: each call answers a new one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from carpool.core.errors import CarpoolError

if TYPE_CHECKING:
    from carpool.client.aio import AsyncClient
    from carpool.client.sse import Event
    from carpool.client.sync import Client

#: The statuses after which a job never changes again.
FINAL = frozenset({"done", "failed", "expired", "cancelled"})
#: How long ``wait`` waits by default, in seconds.
WAIT_TIMEOUT_S = 60.0


class Detached(CarpoolError):
    """Raised when a job handle that no client made (``Job.from_doc`` alone) is asked
    to call the server."""


@dataclass(frozen=True)
class JobDoc:
    """The job document's main fields; ``doc`` is the whole document."""

    id: str
    status: str
    model: str
    result: Any = None
    error: str | None = None
    doc: Mapping[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def queue_position(self) -> int | None:
        """Its place in its bin while queued (0: next), as last described."""
        position = self.doc.get("queue_position")
        return position if isinstance(position, int) else None

    def outcome(self) -> Any:
        """The result of a done job; raises ``JobFailed`` for any other final status."""
        from carpool.client.protocol import JobFailed

        if self.status != "done":
            raise JobFailed(self)
        return self.result


def _fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": str(doc["id"]), "status": str(doc["status"]),
            "model": str(doc.get("model", "")), "result": doc.get("result"),
            "error": doc.get("error"), "doc": doc}


@dataclass(frozen=True)
class Job(JobDoc):
    """A job of the blocking ``Client``."""

    client: Client | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], client: Client | None = None) -> Job:
        return cls(**_fields(doc), client=client)

    def _client(self) -> Client:
        if self.client is None:
            raise Detached(f"job {self.id} has no client: get it from Client.submit or "
                           "Client.result")
        return self.client

    def refresh(self) -> Job:
        """The job as it is now."""
        return self._client().result(self.id)

    def wait(self, timeout_s: float = WAIT_TIMEOUT_S) -> Job:
        """The job once final (long-polls); raises ``JobTimeout`` after ``timeout_s``."""
        return self._client().wait(self, timeout_s)

    def cancel(self) -> bool:
        """``Client.cancel`` of this job; False, with no request, when it is known final."""
        return False if self.final else self._client().cancel(self.id)

    def events(self) -> Iterator[Event]:
        """Its events until it is final (``Client.events``)."""
        return self._client().events([self.id])


@dataclass(frozen=True)
class AsyncJob(JobDoc):
    """A job of the ``AsyncClient``: the calls of ``Job``, as coroutines."""

    client: AsyncClient | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], client: AsyncClient | None = None) -> AsyncJob:
        return cls(**_fields(doc), client=client)

    def _client(self) -> AsyncClient:
        if self.client is None:
            raise Detached(f"job {self.id} has no client: get it from AsyncClient.submit "
                           "or AsyncClient.result")
        return self.client

    async def refresh(self) -> AsyncJob:
        return await self._client().result(self.id)

    async def wait(self, timeout_s: float = WAIT_TIMEOUT_S) -> AsyncJob:
        return await self._client().wait(self, timeout_s)

    async def cancel(self) -> bool:
        return False if self.final else await self._client().cancel(self.id)

    def events(self) -> AsyncIterator[Event]:
        return self._client().events([self.id])
