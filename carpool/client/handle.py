"""A job as a handle: its document as the server last described it, and the calls
that act on it through the client that made it (``refresh``, ``wait``, ``cancel``,
``events``). ``Job`` is the blocking client's, ``AsyncJob`` the asyncio one's (the
same calls, as coroutines). A handle is immutable: each call answers a new one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from carpool.client.jobdoc import JobDoc
from carpool.client.sse import Event
from carpool.core.errors import CarpoolError

#: How long ``wait`` waits by default, in seconds.
WAIT_TIMEOUT_S = 60.0


class Detached(CarpoolError):
    """Raised when a job handle that no client made (``Job.from_doc`` alone) is asked
    to call the server."""


class JobClient(Protocol):
    """What a ``Job`` calls on the blocking client that made it (carpool/client/sync.py)."""

    def result(self, job_id: str, wait: float = 0.0) -> Job: ...

    def wait(self, job: JobDoc, timeout_s: float) -> Job: ...

    def cancel(self, job_id: str) -> bool: ...

    def events(self, job_ids: Sequence[str], last_event_id: str = "") -> Iterator[Event]: ...


class AsyncJobClient(Protocol):
    """What an ``AsyncJob`` awaits on the asyncio client that made it (carpool/client/aio.py)."""

    async def result(self, job_id: str, wait: float = 0.0) -> AsyncJob: ...

    async def wait(self, job: JobDoc, timeout_s: float) -> AsyncJob: ...

    async def cancel(self, job_id: str) -> bool: ...

    def events(self, job_ids: Sequence[str], last_event_id: str = "") -> AsyncIterator[Event]: ...


def _fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": str(doc["id"]), "status": str(doc["status"]),
            "model": str(doc.get("model", "")), "result": doc.get("result"),
            "error": doc.get("error"), "doc": doc}


@dataclass(frozen=True)
class Job(JobDoc):
    """A job of the blocking ``Client``."""

    client: JobClient | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], client: JobClient | None = None) -> Job:
        return cls(**_fields(doc), client=client)

    def _client(self) -> JobClient:
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

    client: AsyncJobClient | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], client: AsyncJobClient | None = None) -> AsyncJob:
        return cls(**_fields(doc), client=client)

    def _client(self) -> AsyncJobClient:
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
