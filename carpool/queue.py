"""The Redis queue protocol: one typed method per Lua script.

This module is the single point of access to Redis for the queue: every Redis
error is turned into ``BackendUnavailable`` here, so the web answers 503 and the
worker backs off, without either knowing redis-py's exception tree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.resources import files
from typing import Any, cast

import redis
from redis.commands.core import Script

from carpool.catalogue import BinSpec, ModelSpec
from carpool.errors import (
    BackendUnavailable,
    BinFull,
    IdempotencyConflict,
    NotCancellable,
    OverShare,
    WaitTooLong,
)
from carpool.jobs import Admitted, BinState, Claim, ClaimedJob, JobView, Outcome, view_from_hash
from carpool.keys import Keys
from carpool.retry_after import (
    DRAIN_MIN_AGE_MS,
    DRAIN_STALE_MS,
    DRAIN_TAU_MS,
    FAIR_SHARE_NEAR,
    drain_rate_per_s,
    fair_lead_cap_ms,
    late_retry_after_s,
    retry_after_s,
    share_retry_after_s,
)
from carpool.urgency import effective_deadline_ms, sort_offset_ms

#: Tokens kept in a wake list; more would only cause extra, harmless peeks.
WAKE_LIST_CAP = 16
#: One claim takes at most this many times max_n ids off a bin, expired ones
#: included, so a backlog of expired jobs is cleared in bounded slices.
CLAIM_SCAN_FACTOR = 4

#: Error replies that mean "not now" (retry later), never "your request is wrong".
_UNAVAILABLE_REPLIES = ("OOM", "LOADING", "READONLY", "MASTERDOWN", "NOAUTH", "WRONGPASS",
                        "BUSY", "MISCONF", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
#: redis-py's classes for some of them; it strips the code ("OOM") from their text.
_UNAVAILABLE_CLASSES = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
                        redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)
#: Redis 6.2 wraps an error raised inside a script: "Error running script ... -OOM ...".
_IN_SCRIPT = re.compile(r"(?:^|: -)(" + "|".join(_UNAVAILABLE_REPLIES) + r")\b")


@contextmanager
def redis_errors() -> Iterator[None]:
    """Turn redis-py's errors into ``BackendUnavailable`` with an actionable message."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise BackendUnavailable(f"Redis is unreachable: {exc}") from exc
    except redis.ResponseError as exc:
        text = str(exc)
        code = _IN_SCRIPT.search(text)
        if isinstance(exc, redis.exceptions.OutOfMemoryError) or (code and code[1] == "OOM"):
            raise BackendUnavailable(
                "Redis is out of memory (maxmemory reached): new jobs are refused until "
                "workers drain the queue") from exc
        if isinstance(exc, _UNAVAILABLE_CLASSES) or code:
            raise BackendUnavailable(f"Redis refused the command: {text}") from exc
        raise


def load_script(client: redis.Redis, name: str) -> Script:
    """Register ``carpool/lua/<name>.lua`` once; redis-py reloads it on NOSCRIPT."""
    source = files("carpool").joinpath("lua", f"{name}.lua").read_text()
    return client.register_script(source)


_script = load_script


def connect(
    url: str, *, socket_timeout_s: float | None = 5.0, max_connections: int | None = None
) -> redis.Redis:
    """A client for ``url`` that returns str; the timeout bounds a hung Redis.

    redis-py's default pool fails a command ("Too many connections") once 100
    are in use. With ``max_connections``, a command that finds them all busy
    waits for one, up to the socket timeout: what a web process whose thousands
    of greenlets share one client needs.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": 2.0,
        "health_check_interval": 30,
    }
    if max_connections is None:
        return redis.Redis.from_url(url, **options)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=socket_timeout_s, **options
    )
    return redis.Redis.from_pool(pool)  # the client owns the pool: close() closes both


class Queue:
    """Admit, peek, claim, complete and cancel jobs; each is one Lua script call."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._admit = _script(client, "admit")
        self._peek = _script(client, "peek")
        self._claim = _script(client, "claim")
        self._complete = _script(client, "complete")
        self._cancel = _script(client, "cancel")

    def admit(
        self,
        model: ModelSpec,
        bin_spec: BinSpec,
        job_id: str,
        input_json: str,
        *,
        queued_ttl_s: int,
        deadline_ms: int = 0,
        priority: int = 0,
        idempotency_digest: str | None = None,
        input_digest: str = "",
        owner: str = "",
        owner_weight: float = 1.0,
    ) -> Admitted:
        """Queue one job; raises ``BinFull`` at the bin's bound (checked atomically), and
        ``WaitTooLong`` when it would start after its deadline (else max_queue_ms), and
        ``OverShare`` near the bound when ``owner`` is over its ``owner_weight``'s share.
        With an ``owner``, the job sorts behind that owner's backlog by its virtual clock
        (fair queueing between owners: docs/admission.md).

        ``deadline_ms`` 0 takes the model's default deadline; where the job sorts in
        its bin follows from its deadline and priority (carpool.urgency).
        """
        idem_key = self.keys.idempotency(model.name, idempotency_digest or "-")
        keys = [self.keys.bin(model.name, bin_spec.name), self.keys.job(job_id),
                self.keys.wake(model.name), idem_key, self.keys.stats(model.name, bin_spec.name),
                self.keys.tenants(model.name, bin_spec.name)]
        deadline_ms = effective_deadline_ms(model, deadline_ms)
        args: list[str | int] = [job_id, model.name, bin_spec.name, input_json, bin_spec.max_depth,
                bin_spec.max_batch, queued_ttl_s, deadline_ms, priority,
                "1" if idempotency_digest else "0", input_digest, owner, WAKE_LIST_CAP,
                sort_offset_ms(model, deadline_ms, priority), DRAIN_TAU_MS,
                model.max_queue_ms_of(bin_spec), DRAIN_MIN_AGE_MS, DRAIN_STALE_MS,
                f"{owner_weight:g}", f"{FAIR_SHARE_NEAR:g}",
                fair_lead_cap_ms(model.max_queue_ms_of(bin_spec))]
        with redis_errors():
            reply = self._admit(keys=keys, args=args)
        kind = reply[0]
        if kind == "ok":
            return Admitted(job_id, model.name, bin_spec.name, int(reply[2]))
        if kind == "dup":
            return Admitted(str(reply[1]), model.name, bin_spec.name, 0, duplicate=True)
        if kind == "conflict":
            raise IdempotencyConflict(
                f"idempotency key was first used for job {reply[1]} with a different input"
            )
        depth = int(reply[1])
        if kind == "late":
            rate, limit_ms = float(reply[2]), int(reply[3])
            raise WaitTooLong(model.name, bin_spec.name, depth,
                              depth / rate * 1000.0 if rate > 0 else float("inf"), limit_ms,
                              late_retry_after_s(depth, rate, limit_ms))
        rate = drain_rate_per_s(float(reply[2]), int(reply[3]))
        if kind == "share":
            raise OverShare(model.name, bin_spec.name, depth,
                            share_retry_after_s(float(reply[4]), rate))
        raise BinFull(model.name, bin_spec.name, depth, retry_after_s(depth, rate))

    def peek(
        self, bins: Sequence[tuple[str, str]], scan: Sequence[int] | None = None
    ) -> tuple[int, list[BinState]]:
        """Redis time (ms) and each (model, bin)'s state (``BinState`` says over which jobs).

        ``scan`` is each bin's max_batch as the worker holds it now (default 1: the head).
        """
        scan = [1] * len(bins) if scan is None else scan
        keys = ([self.keys.bin(m, b) for m, b in bins]
                + [self.keys.stats(m, b) for m, b in bins])
        with redis_errors():
            reply = self._peek(keys=keys, args=[self.keys.job_prefix, *scan])
        now_ms = int(reply[0])
        states = []
        for i, (model, bin_name) in enumerate(bins):
            depth, oldest, earliest, admitted = (int(x) for x in reply[1 + 4 * i: 5 + 4 * i])
            states.append(BinState(model, bin_name, depth, oldest if oldest >= 0 else None,
                                   earliest if earliest > 0 else None, admitted))
        return now_ms, states

    def claim(
        self, model: ModelSpec, bin_name: str, max_n: int, *, lease_ms: int, token: str,
        worker: str,
    ) -> Claim:
        """Lease up to ``max_n`` of the bin's most urgent live jobs to ``token``."""
        keys = [self.keys.bin(model.name, bin_name), self.keys.leases]
        args: list[str | int] = [max_n, lease_ms, token, self.keys.job_prefix, worker,
                self.keys.done_channel, model.result_ttl_s, max_n * CLAIM_SCAN_FACTOR]
        with redis_errors():
            reply = self._claim(keys=keys, args=args)
        jobs = tuple(
            ClaimedJob(str(reply[i]), str(reply[i + 1]), int(reply[i + 2]), int(reply[i + 3]))
            for i in range(2, len(reply), 4)
        )
        return Claim(model.name, bin_name, token, int(reply[0]), jobs, expired=int(reply[1]))

    def complete(
        self, model: ModelSpec, claim: Claim, outcomes: Sequence[Outcome], batch: dict[str, Any]
    ) -> list[bool]:
        """Write each outcome once; False where the lease was lost (the write is refused)."""
        args: list[Any] = [claim.token, self.keys.job_prefix, self.keys.done_channel,
                           model.result_ttl_s, json.dumps(batch), DRAIN_TAU_MS]
        for o in outcomes:
            timings = json.dumps({"preprocess": round(o.preprocess_ms, 3),
                                  "inference": round(o.inference_ms, 3)})
            if o.failed:
                args += [o.id, "failed", o.error, timings]
            else:
                args += [o.id, "done", json.dumps(o.result), timings]
        keys = [self.keys.leases, self.keys.stats(model.name, claim.bin)]
        with redis_errors():
            reply = self._complete(keys=keys, args=args)
        return [bool(x) for x in reply]

    def cancel(self, job_id: str, result_ttl_s: int) -> str:
        """"cancelled" or "deleted"; raises ``NotCancellable`` while it runs; "missing"."""
        with redis_errors():
            reply = str(self._cancel(
                keys=[self.keys.job(job_id)],
                args=[job_id, self.keys.bin_prefix, self.keys.done_channel, result_ttl_s],
            ))
        if reply == "running":
            raise NotCancellable(f"job {job_id} is running and can no longer be cancelled")
        return reply

    def get(self, job_id: str) -> JobView | None:
        with redis_errors():
            h = cast(dict[str, str], self.client.hgetall(self.keys.job(job_id)))
        return view_from_hash(job_id, h) if h else None

    def depths(self, bins: Sequence[tuple[str, str]]) -> list[int]:
        with redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for model, bin_name in bins:
                pipe.zcard(self.keys.bin(model, bin_name))
            return [int(x) for x in pipe.execute()]

    def wait_for_work(self, models: Sequence[str], timeout_s: float) -> bool:
        """Block until a wake token arrives for one of ``models``, or ``timeout_s`` passes."""
        with redis_errors():
            got = self.client.blpop([self.keys.wake(m) for m in models], timeout=timeout_s)
        return got is not None

    def ping(self) -> None:
        with redis_errors():
            self.client.ping()
