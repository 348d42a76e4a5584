"""One short real run: `carpool bench sweep` against real gunicorn and Celery processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.bench.cli import main
from carpool.bench.records import read_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_short_sweep_on_a_real_stack_writes_every_report_file(
    tmp_path: Path, redis_url: str
) -> None:
    # 5 % and 10 % of one worker's limit (615 jobs/s), 1.5 s each: a few seconds in all.
    code = main(["sweep", "--fractions", "0.05,0.1", "--duration", "1.5", "--grace-s", "30",
                 "--redis-url", redis_url, "--out", str(tmp_path)])
    assert code == 0  # non-zero would mean misrouted or lost results
    for name in ("latency-vs-throughput.png", "batch-sizes.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    summaries = list(read_jsonl(tmp_path / "summary.jsonl"))
    assert [s["extra"]["fraction"] for s in summaries] == [0.05, 0.1]
    for s in summaries:
        assert s["counts"]["ok"] == s["jobs"] > 0
        assert s["extra"]["transport"] == "http"
        assert s["extra"]["server_429s"] == 0  # the web's /metrics was read: no 429 there
    jobs = list(read_jsonl(tmp_path / "jobs.jsonl"))
    assert len(jobs) == sum(s["jobs"] for s in summaries)
    assert all(j["batch_size"] >= 1 and j["timings_ms"]["total"] >= 0 for j in jobs)
    report = (tmp_path / "report.md").read_text()
    assert "Misrouted results: 0. Lost jobs: 0." in report
    assert "knee rule" in report


@pytest.mark.parametrize("protocol", ["wait", "v2"])
def test_a_short_run_through_each_one_round_trip_protocol_verifies_every_job(
    tmp_path: Path, redis_url: str, protocol: str
) -> None:
    code = main(["run", "--rate", "40", "--duration", "1.5", "--grace-s", "30",
                 "--protocol", protocol, "--cost-ms", "2,0.1", "--redis-url", redis_url,
                 "--out", str(tmp_path)])
    assert code == 0
    jobs = list(read_jsonl(tmp_path / "jobs.jsonl"))
    assert jobs and all(j["outcome"] == "ok" for j in jobs)
    # One request per job: 200 with the answer (never the poll mode's 202).
    assert {j["http_status"] for j in jobs} == {200}
