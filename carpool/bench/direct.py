"""The worker-only driver: admit straight into Redis, learn of each end from pub/sub.

No web tier in the path, so it measures what the workers can do: a backlog of
N jobs admitted at once (the drain mode) gives saturated throughput; a rate
gives latency at a known fraction of the workers' capacity. Jobs are admitted
with the queue's own admit script, exactly as the web tier admits them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from carpool.backend import records as job_records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.connection import connect, open_pubsub
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue, ended_ids
from carpool.bench.arrivals import Arrival
from carpool.bench.records import JobRecord, Outcome, batch_fields, verify
from carpool.bench.workload import SYNTHETIC, make_input
from carpool.core.errors import BinFull
from carpool.core.jobs import new_job_id, view_from_record
from carpool.core.settings import Settings

#: Job records read per pipelined round trip when collecting results.
FETCH_CHUNK = 500
#: How long the listener blocks on one read before checking whether to stop.
LISTEN_POLL_S = 0.2


@dataclass
class _Listener:
    """Records when each of our jobs' ids is published on the done channel."""

    pubsub: redis.client.PubSub
    ours: set[str]
    tick: Callable[[], None]
    t0: float
    done_at: dict[str, float]
    cond: threading.Condition
    stop: threading.Event

    def run(self) -> None:
        while not self.stop.is_set():
            msg = self.pubsub.get_message(timeout=LISTEN_POLL_S)
            if msg is None or msg["type"] != "message":
                continue
            for job_id in ended_ids(str(msg["data"])):
                if job_id in self.ours and job_id not in self.done_at:
                    with self.cond:
                        self.done_at[job_id] = time.monotonic() - self.t0
                        self.cond.notify_all()
                    self.tick()


def _subscribe(client: redis.Redis, channel: str) -> redis.client.PubSub:
    pubsub = open_pubsub(client)
    pubsub.subscribe(channel)
    # Admit nothing before the subscription is live, or early ends would be missed.
    confirmed = pubsub.get_message(timeout=5.0)
    if confirmed is None or confirmed["type"] != "subscribe":
        raise RuntimeError(f"could not subscribe to {channel}")
    return pubsub


def run_direct(
    arrivals: Sequence[Arrival], settings: Settings, nonce: str, *,
    model: str = SYNTHETIC, grace_s: float = 60.0, tick: Callable[[], None] = lambda: None,
) -> list[JobRecord]:
    """Admit ``arrivals`` on their schedule; wait for every end; one record per job."""
    keys = Keys(settings.key_prefix)
    client = connect(settings.redis_url, cluster=settings.redis_cluster)
    queue = Queue(client, keys)
    spec = settings.catalogue.get(model)
    t0 = time.monotonic()
    listener = _Listener(_subscribe(connect(settings.redis_url), keys.done_channel), set(),
                         tick, t0, {}, threading.Condition(), threading.Event())
    thread = threading.Thread(target=listener.run, name="bench-done-listener", daemon=True)
    thread.start()
    admitted: list[tuple[int, str, dict[str, Any], float]] = []
    rejected: list[JobRecord] = []
    admissions = Admissions(queue.client, queue.keys)
    try:
        for seq, arrival in enumerate(arrivals):
            delay = arrival.t_s - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)  # pacing the open-loop schedule, not waiting for work
            job_id = new_job_id(spec.name)
            job_input = make_input(nonce, seq, arrival.size, arrival.payload)
            listener.ours.add(job_id)
            t_start = time.monotonic() - t0
            try:
                single_admitted(admissions.admit(AdmitRequest(
                    spec, (AdmitJob(spec.bin_for(arrival.size), job_id, json.dumps(job_input)),),
                    queued_ttl_s=settings.queued_ttl_s)))
            except BinFull:
                rejected.append(JobRecord(seq, arrival.size, arrival.t_s, t_start,
                                          Outcome.REJECTED, t_final=t_start, http_status=429))
                tick()
                continue
            admitted.append((seq, job_id, job_input, t_start))
        last = arrivals[-1].t_s if arrivals else 0.0
        with listener.cond:
            listener.cond.wait_for(lambda: len(listener.done_at) >= len(admitted),
                                   timeout=max(0.0, t0 + last + grace_s - time.monotonic()))
    finally:
        listener.stop.set()
        thread.join()
        listener.pubsub.close()
    records = rejected + _collect(client, keys, arrivals, admitted, listener.done_at)
    client.close()
    return sorted(records, key=lambda r: r.seq)


def _collect(
    client: redis.Redis, keys: Keys, arrivals: Sequence[Arrival],
    admitted: list[tuple[int, str, dict[str, Any], float]], done_at: dict[str, float],
) -> list[JobRecord]:
    """Read every admitted job's record and judge it, in pipelined chunks."""
    out = []
    for i in range(0, len(admitted), FETCH_CHUNK):
        chunk = admitted[i : i + FETCH_CHUNK]
        pipe = client.pipeline(transaction=False)
        for _, job_id, _, _ in chunk:
            pipe.get(keys.job(job_id))
        for (seq, job_id, job_input, t_start), row in zip(chunk, pipe.execute(), strict=True):
            h = job_records.parse(row) if row is not None else {}
            arrival = arrivals[seq]
            base = JobRecord(seq, arrival.size, arrival.t_s, t_start, Outcome.LOST,
                             job_id=job_id, http_status=202)
            out.append(_judge(base, job_input, h, done_at.get(job_id)))
    return out


def _judge(base: JobRecord, job_input: dict[str, Any], h: dict[str, str],
           t_final: float | None) -> JobRecord:
    if not h or "t_done" not in h:
        # A claimed job's record says "queued" too (claim.lua writes none).
        detail = ("record gone" if not h else
                  f"not finished at the deadline (its record says {h.get('status')})")
        return replace(base, detail=detail)
    body = view_from_record(base.job_id, h).to_json()
    verdict = verify(base.job_id, job_input, body)
    admit_ms, done_ms = int(h["t_admit"]), int(h["t_done"])
    if t_final is None:  # pub/sub is at-most-once: fall back on Redis's own clock
        t_final = base.t_start + (done_ms - admit_ms) / 1000.0
    return replace(base, outcome=verdict.outcome, detail=verdict.detail, t_final=t_final,
                   server_admit_ms=admit_ms, server_done_ms=done_ms, **batch_fields(body))
