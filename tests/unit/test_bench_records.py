"""A result is checked to be its own job's: id, echo and checksum; JSON lines round-trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from carpool.bench.records import (
    JobRecord,
    Outcome,
    batch_fields,
    read_records,
    verify,
    write_jsonl,
)
from carpool.bench.workload import make_input
from carpool.core.synthetic import expected_result

JOB = "x" * 22


def _body(job_input: dict[str, Any], **over: Any) -> dict[str, Any]:
    body = {"id": JOB, "model": "synthetic", "status": "done",
            "result": expected_result(job_input),
            "timings_ms": {"queue": 3, "preprocess": 0.1, "inference": 21, "total": 24.1},
            "batch": {"size": 5, "bin": "small", "worker": "w0"}}
    body.update(over)
    return body


def test_the_right_result_is_ok() -> None:
    job_input = make_input("run1", 7, 16)
    assert verify(JOB, job_input, _body(job_input)).outcome is Outcome.OK


def test_another_jobs_result_is_misrouted() -> None:
    mine, theirs = make_input("run1", 7, 16), make_input("run1", 8, 16)
    verdict = verify(JOB, mine, _body(theirs))
    assert verdict.outcome is Outcome.MISROUTED
    assert "echo" in verdict.detail


def test_a_right_echo_with_a_wrong_checksum_is_misrouted() -> None:
    # Same value, other size: the echo matches, the checksum of the whole input does not.
    mine, theirs = make_input("run1", 7, 16), make_input("run1", 7, 17)
    verdict = verify(JOB, mine, _body(theirs))
    assert verdict.outcome is Outcome.MISROUTED
    assert "checksum" in verdict.detail


def test_an_answer_for_another_id_is_misrouted() -> None:
    job_input = make_input("run1", 7, 16)
    verdict = verify(JOB, job_input, _body(job_input, id="y" * 22))
    assert verdict.outcome is Outcome.MISROUTED


def test_a_failed_job_is_failed_with_its_reason() -> None:
    job_input = make_input("run1", 7, 16)
    body = _body(job_input, status="failed", error="boom")
    del body["result"]
    verdict = verify(JOB, job_input, body)
    assert verdict.outcome is Outcome.FAILED and "boom" in verdict.detail


def test_values_are_unique_per_run_and_sequence() -> None:
    assert make_input("a", 1, 16) != make_input("a", 2, 16)
    assert make_input("a", 1, 16) != make_input("b", 1, 16)


def test_batch_fields_come_from_the_result_body() -> None:
    fields = batch_fields(_body(make_input("run1", 1, 16)))
    assert fields["batch_size"] == 5 and fields["bin"] == "small" and fields["worker"] == "w0"
    assert fields["timings_ms"]["inference"] == 21.0


def test_records_round_trip_through_json_lines(tmp_path: Path) -> None:
    records = [
        JobRecord(0, 16, 0.0, 0.001, Outcome.OK, t_final=0.05, http_status=202, job_id=JOB,
                  batch_size=3, timings_ms={"queue": 1.0}, server_admit_ms=5, server_done_ms=9),
        JobRecord(1, 16, 0.1, 0.101, Outcome.LOST, detail="not final before the deadline"),
    ]
    path = tmp_path / "jobs.jsonl"
    write_jsonl(path, (r.to_json() for r in records))
    assert read_records(path) == records
