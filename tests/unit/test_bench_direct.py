"""The worker-only driver's judgement of a job hash read back from Redis."""

from __future__ import annotations

import json
from typing import Any

from carpool.bench.direct import _judge
from carpool.bench.records import JobRecord, Outcome
from carpool.bench.workload import make_input
from carpool.core.synthetic import expected_result

JOB = "j" * 22


def _hash(result: Any, status: str = "done") -> dict[str, str]:
    return {"model": "synthetic", "status": status, "t_admit": "1000", "t_claim": "1015",
            "t_done": "1040", "timings": json.dumps({"preprocess": 0.1, "inference": 24.0}),
            "batch": json.dumps({"size": 7, "bin": "small", "worker": "w0"}),
            "result": json.dumps(result)}


def _base() -> JobRecord:
    return JobRecord(3, 16, 0.5, 0.501, Outcome.LOST, job_id=JOB, http_status=202)


def test_a_done_job_with_its_own_result_is_ok_with_redis_times() -> None:
    job_input = make_input("run", 3, 16)
    record = _judge(_base(), job_input, _hash(expected_result(job_input)), t_final=0.55)
    assert record.outcome is Outcome.OK
    assert (record.server_admit_ms, record.server_done_ms) == (1000, 1040)
    assert record.batch_size == 7 and record.timings_ms["queue"] == 15.0
    assert record.e2e_ms is not None and abs(record.e2e_ms - 50.0) < 1e-9


def test_a_missed_notification_falls_back_on_redis_clock() -> None:
    job_input = make_input("run", 3, 16)
    record = _judge(_base(), job_input, _hash(expected_result(job_input)), t_final=None)
    assert record.t_final is not None and abs(record.t_final - (0.501 + 0.040)) < 1e-9


def test_another_jobs_result_in_the_hash_is_misrouted() -> None:
    mine, theirs = make_input("run", 3, 16), make_input("run", 4, 16)
    record = _judge(_base(), mine, _hash(expected_result(theirs)), t_final=0.55)
    assert record.outcome is Outcome.MISROUTED


def test_a_vanished_or_unfinished_job_is_lost() -> None:
    job_input = make_input("run", 3, 16)
    gone = _judge(_base(), job_input, {}, t_final=None)
    assert gone.outcome is Outcome.LOST and gone.detail == "record gone"
    queued = {"model": "synthetic", "status": "queued", "t_admit": "1000"}
    still = _judge(_base(), job_input, queued, t_final=None)
    assert still.outcome is Outcome.LOST and "queued" in still.detail
