"""A results message's jobs are kept as they came and parsed only when a poll asks."""

from __future__ import annotations

import json

import pytest

import carpool.backend.pushed
from carpool.backend.pushed import parse
from carpool.core.jobs import JobStatus, JobView, view_from_record
from web.results.pushed_views import PushedViews

IDS = ["AAAA" + c * 22 for c in "abc"]


def _line(job_id: str, **extra: str) -> str:
    return json.dumps({"id": job_id, "status": "done", "result": "[1, 2]", "timings": "{}",
                       "model": "m", "t_admit": "10", "t_claim": "12", "attempts": "1",
                       **extra}, separators=(",", ":"))


def _message(*lines: str) -> str:
    return "\n".join(["done 20", '{"size": 3}', *lines])


def test_each_job_is_known_by_its_id_before_any_view_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def counted(job_id: str, fields: dict[str, str]) -> JobView:
        built.append(job_id)
        return view_from_record(job_id, fields)

    monkeypatch.setattr(carpool.backend.pushed, "view_from_record", counted)
    got = parse(_message(*(_line(i) for i in IDS)))
    assert [job.id for job in got.jobs] == IDS and built == []
    kept = PushedViews()
    kept.put(got.jobs, 100)
    view = kept.get(IDS[1])
    assert view is not None and built == [IDS[1]]  # only the one asked for
    assert view.status is JobStatus.DONE and view.result == [1, 2] and view.batch == {"size": 3}
    assert view.timings_ms is not None and view.timings_ms["total"] == 10.0
    assert kept.get(IDS[1]) is view and built == [IDS[1]] and kept.hits == 2  # built once


def test_a_line_in_another_field_order_is_still_read() -> None:
    line = json.dumps({"status": "done", "result": "1", "id": IDS[0], "t_admit": "1",
                       "model": "m"})
    (job,) = parse(_message(line)).jobs
    assert job.id == IDS[0] and job.view().result == 1


@pytest.mark.parametrize("line", [
    '{"id":"' + IDS[0] + '","status":"done",',  # cut short
    '{"id":"' + IDS[0] + '","status":"no-such-status"}',
    '{"id":"' + IDS[0] + '","id":"' + IDS[2] + '","status":"done"}',  # its ids disagree
])
def test_a_broken_job_is_dropped_when_asked_for_and_its_poll_reads_redis(line: str) -> None:
    kept = PushedViews()
    kept.put(parse(_message(line, _line(IDS[1]))).jobs, 100)
    assert kept.get(IDS[0]) is None and len(kept) == 1  # dropped; the other one stays
    assert kept.get(IDS[1]) is not None
