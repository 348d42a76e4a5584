"""Locust for carpool's async API: job end-to-end latency next to the HTTP stats.

    locust -f ops/locustfile.py --host http://127.0.0.1:8000 \
        --headless --users 20 --spawn-rate 20 --run-time 1m

Each user submits synthetic jobs and long-polls each one's result. Locust's
own table shows ``POST /submit`` and ``GET /result/[id]`` as usual; one more
row, type ``JOB``, times each job from its submit to its final result, and
counts as failures the jobs that were rejected (429), failed, lost (404 for an
accepted id) or misrouted (echo or checksum not this job's: every job's value
is unique, so a result delivered to the wrong job shows).

Locust users are closed loops: a user waits for its job before the next one
(paced by ``constant_throughput``), so an overloaded server slows the offered
rate down. For open-loop figures use ``carpool bench``; this file is for people
who already run Locust. Locust is not a carpool dependency: ``pip install locust``.

Environment: CARPOOL_LOCUST_MODEL (synthetic), CARPOOL_LOCUST_SIZE (16),
CARPOOL_LOCUST_JOBS_PER_USER_S (2: each user's job rate), CARPOOL_LOCUST_WAIT_S
(30: the ?wait= of each long-poll).
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from typing import Any

from locust import FastHttpUser, constant_throughput, task

from carpool.core.synthetic import checksum

MODEL = os.environ.get("CARPOOL_LOCUST_MODEL", "synthetic")
SIZE = int(os.environ.get("CARPOOL_LOCUST_SIZE", "16"))
JOBS_PER_USER_S = float(os.environ.get("CARPOOL_LOCUST_JOBS_PER_USER_S", "2"))
WAIT_S = float(os.environ.get("CARPOOL_LOCUST_WAIT_S", "30"))
FINAL = frozenset({"done", "failed", "expired", "cancelled"})
#: One per Locust process, so values never repeat across runs on one Redis.
RUN = secrets.token_hex(8)
_seq = itertools.count()


class JobFailed(Exception):
    """Raised (reported, never thrown) for a job that did not end with its own result."""


class CarpoolJobUser(FastHttpUser):
    wait_time = constant_throughput(JOBS_PER_USER_S)

    @task
    def job(self) -> None:
        job_input = {"value": {"run": RUN, "seq": next(_seq)}, "size": SIZE}
        started = time.perf_counter()
        job_id, problem = self._submit(job_input)
        body: dict[str, Any] = {}
        if job_id is not None:
            body, problem = self._await_final(job_id)
        if not problem:
            problem = _check(job_id or "", job_input, body)
        self.environment.events.request.fire(
            request_type="JOB", name=MODEL,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=0, exception=JobFailed(problem) if problem else None,
            context={"job_id": job_id, "batch": body.get("batch")}, url=None, response=None,
        )

    def _submit(self, job_input: dict[str, Any]) -> tuple[str | None, str]:
        payload = {"model": MODEL, "input": job_input}
        with self.client.post("/submit", json=payload, catch_response=True) as resp:
            if resp.status_code == 202:
                return str(resp.json()["id"]), ""
            if resp.status_code == 429:
                resp.failure("429: bin full")
                return None, "rejected (429)"
            resp.failure(f"{resp.status_code}: {(resp.text or '')[:100]}")
            return None, f"submit answered {resp.status_code}"

    def _await_final(self, job_id: str) -> tuple[dict[str, Any], str]:
        while True:
            with self.client.get(f"/result/{job_id}?wait={WAIT_S:g}", name="/result/[id]",
                                 catch_response=True) as resp:
                if resp.status_code == 404:
                    resp.failure("404 for an accepted id")
                    return {}, "lost (404 for an accepted id)"
                if resp.status_code != 200:
                    resp.failure(f"{resp.status_code}")
                    continue  # a 503 while Redis restarts: ask again
                body: dict[str, Any] = resp.json()
                if body.get("status") in FINAL:
                    return body, ""


def _check(job_id: str, job_input: dict[str, Any], body: dict[str, Any]) -> str:
    """Empty when ``body`` is this job's successful result, else what is wrong."""
    if body.get("id") != job_id:
        return f"misrouted: asked for {job_id}, got {body.get('id')}"
    if body.get("status") != "done":
        return f"{body.get('status')}: {body.get('error', '')}"[:200]
    result = body.get("result") or {}
    if result.get("echo") != job_input["value"] or result.get("checksum") != checksum(job_input):
        return "misrouted: echo or checksum is another job's"
    return ""
