"""Helpers shared by the fault scenarios (tests/e2e/test_faults_*.py).

- ``DoneCounter`` counts every publication of a finished id on the done channel:
  each job must end exactly once, so each id must be published exactly once.
- ``spawn_worker`` starts a worker without waiting for it to be ready, for
  workers that are meant to die early (a poison input).
- ``record`` appends a scenario's measured numbers to ``$CARPOOL_FAULT_REPORT``
  (JSON lines) when set: docs/reliability.md is written from those files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import redis

from carpool.backend import records
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest, single_admitted
from carpool.backend.audit import snapshot, violations
from carpool.backend.connection import open_pubsub
from carpool.backend.keys import Keys
from carpool.backend.queue import Queue, ended_ids
from carpool.core.catalogue import ModelSpec
from carpool.core.jobs import JobStatus, new_job_id
from carpool.core.shards import shard_of_job
from carpool.stack.waiting import wait_until
from tests.support.procs import REPO_ROOT, worker_command

#: How long a test waits for a process to exit once it was told to (or killed).
EXIT_TIMEOUT_S = 30.0


def record(scenario: str, **numbers: Any) -> None:
    """Append one scenario's measurements to $CARPOOL_FAULT_REPORT, if set."""
    path = os.environ.get("CARPOOL_FAULT_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"scenario": scenario, **numbers}) + "\n")


class DoneCounter:
    """Counts publications of each id on the done channel, from a thread."""

    def __init__(self, client: redis.Redis, channel: str) -> None:
        self.counts: Counter[str] = Counter()
        self._pubsub = open_pubsub(client)
        self._pubsub.subscribe(channel)
        first = self._pubsub.get_message(timeout=5)
        assert first is not None and first["type"] == "subscribe"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._pubsub.get_message(timeout=0.2)
            except (redis.ConnectionError, redis.TimeoutError):
                return  # the Redis under test went away; counts so far stand
            if msg is not None and msg["type"] == "message":
                with self._lock:
                    self.counts.update(ended_ids(str(msg["data"])))

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def counted(self, ids: Iterable[str], timeout_s: float = 30.0) -> Counter[str]:
        """The counts once every id in ``ids`` has been seen at least once.

        A job's record is final a moment before this thread reads its publication,
        longer on a busy machine: a snapshot taken when the records are final can
        miss the last ones."""
        wanted = set(ids)
        wait_until(lambda: wanted <= set(self.snapshot()), timeout_s,
                   f"a done publication for each of {len(wanted)} jobs")
        return self.snapshot()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()


def admit_jobs(queue: Queue, spec: ModelSpec, values: Iterable[Any], size: int = 1,
               ttl_s: int = 600) -> list[str]:
    """Admit one synthetic job per value straight into Redis (no web), in order."""
    bin_spec = spec.bin_for(size)
    return [single_admitted(Admissions(queue.client, queue.keys).admit(AdmitRequest(
        spec, (AdmitJob(bin_spec, new_job_id(spec.name), json.dumps({"value": v, "size": size})),),
        queued_ttl_s=ttl_s))).id for v in values]


def attempts_of(queue: Queue, job_id: str) -> int:
    """Runs a job has started: while a claim holds it, the claim's count (claim.lua
    writes none to the record); else the record's; a finished record without one
    ran once (complete.lua), a queued one never."""
    tag = shard_of_job(job_id)
    for token in queue.client.zrange(queue.keys.leases(tag), 0, -1):
        held = queue.client.hget(queue.keys.claim(tag, token), job_id)
        if held:
            return int(held)
    record = records.read(queue.client, queue.keys.job(job_id)) or {}
    status, count = record.get("status"), record.get("attempts")
    if count:
        return int(count)
    return 1 if status in (JobStatus.DONE, JobStatus.FAILED) else 0


def statuses(queue: Queue, ids: Iterable[str]) -> dict[str, JobStatus | None]:
    out: dict[str, JobStatus | None] = {}
    for job_id in ids:
        view = queue.get(job_id)
        out[job_id] = None if view is None else view.status
    return out


def all_final(queue: Queue, ids: Iterable[str]) -> bool:
    return all(s is not None and s.is_final for s in statuses(queue, ids).values())


def assert_one_place(client: redis.Redis, keys: Keys, admitted: Iterable[str],
                     models: Iterable[str] = ("synthetic",)) -> None:
    found = violations(snapshot(client, keys, models), admitted)
    assert found == [], found


def spawn_worker(env: Mapping[str, str], node_name: str, log_path: Path
                 ) -> subprocess.Popen[bytes]:
    """A worker process, not waited for: it may die before it says it is ready."""
    cmd = [*worker_command(node_name), "--logfile", str(log_path)]
    # Metrics off, as start_worker does: test workers would fight over port 9100.
    env = {"CARPOOL_WORKER_METRICS_PORT": "0", **env}
    with open(log_path.with_suffix(".out"), "ab") as out:
        return subprocess.Popen(cmd, env={**os.environ, **env}, cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (after SIGCONT, in case it was stopped), then SIGKILL past the bound."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(EXIT_TIMEOUT_S)


class Stopwatch:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def s(self) -> float:
        return round(time.monotonic() - self.t0, 2)
