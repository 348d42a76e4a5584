"""A Python client for carpool's HTTP API, sync and asyncio, on httpx.

    from carpool.client import Client

    with Client("http://127.0.0.1:8000", api_key=None) as c:
        print(c.run("synthetic", {"value": "hi", "size": 8}))       # one round trip
        print(c.map("synthetic", [{"value": i, "size": 8} for i in range(100)]))

Each call answers a ``Job`` handle: ``job.refresh()``, ``job.wait()``, ``job.cancel()``,
``job.events()`` (server-sent events until it is final). ``AsyncClient`` has the same
methods, as coroutines (its handles are ``AsyncJob``). Refusals raise typed errors
(``Overloaded`` for 429 with its ``retry_after_s``, ``Unavailable`` for 503,
``RequestRejected`` for other 4xx); 429, 503 and refused connections are first
retried with exponential backoff that waits at least what ``Retry-After`` says.
This package imports neither torch nor flask.
"""

from carpool.client.aio import AsyncClient
from carpool.client.errors import (
           ApiError,
           ClientError,
           ConnectionBroken,
           Overloaded,
           RequestRejected,
           ServerUnreachable,
           Unavailable,
)
from carpool.client.handle import AsyncJob, Detached, Job
from carpool.client.jobdoc import JobDoc, JobFailed, JobTimeout
from carpool.client.protocol import RetryPolicy
from carpool.client.sse import Event
from carpool.client.sync import Client
from carpool.client.webhooks import WebhookInvalid, verify_webhook

__all__ = ["ApiError", "AsyncClient", "AsyncJob", "Client", "ClientError", "ConnectionBroken",
           "Detached", "Event",
           "Job", "JobDoc", "JobFailed", "JobTimeout", "Overloaded", "RequestRejected",
           "RetryPolicy", "ServerUnreachable", "Unavailable", "WebhookInvalid", "verify_webhook"]
