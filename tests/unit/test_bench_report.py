"""The report files: a markdown table, JSON lines and PNG plots from recorded results."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from carpool.bench import plots
from carpool.bench.records import read_jsonl, read_records
from carpool.bench.report import markdown_table, write_outputs
from carpool.bench.stats import summarize
from carpool.bench.sweep import StepResult

RECORDED = Path(__file__).parent / "data" / "bench_records.jsonl"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _result(label: str = "configured 20/s") -> StepResult:
    records = read_records(RECORDED)
    summary = summarize(label, records, duration_s=0.5)
    return StepResult(replace(summary, extra={"target": "configured", "limit_per_s": 615.0}),
                      records)


def test_the_table_shows_misrouted_and_lost_counts() -> None:
    table = markdown_table([_result().summary])
    header, rule, row = table.splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    cells = dict(zip(columns, [c.strip() for c in row.strip("|").split("|")], strict=True))
    assert cells["misrouted"] == "1" and cells["lost"] == "1" and cells["429"] == "1"
    assert cells["run"] == "configured 20/s"
    assert cells["of limit"] == "2%"  # 12.2 jobs/s of 615


def test_outputs_are_written_and_name_their_findings(tmp_path: Path) -> None:
    result = _result()
    plots.batch_histogram([result.summary], tmp_path / "batch-sizes.png")
    report = write_outputs(tmp_path, [result], "# header", ["a note"])
    text = report.read_text()
    assert "Misrouted results: 1. Lost jobs: 1." in text
    assert "- a note" in text and "![batch-sizes.png](batch-sizes.png)" in text
    (summary,) = list(read_jsonl(tmp_path / "summary.jsonl"))
    assert summary["counts"]["misrouted"] == 1 and summary["mean_batch"] == 2.0
    jobs = list(read_jsonl(tmp_path / "jobs.jsonl"))
    assert len(jobs) == 10 and jobs[0]["run"] == "configured 20/s"


def test_plots_are_pngs(tmp_path: Path) -> None:
    result = _result()
    knees = {"configured": result.summary}
    written = [
        plots.latency_vs_throughput([result.summary], knees, tmp_path / "lat.png"),
        plots.batch_histogram([result.summary], tmp_path / "hist.png"),
        plots.latency_over_time(result.records, tmp_path / "time.png", "title"),
    ]
    for path in written:
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_the_table_shows_the_webs_own_429_p99_as_a_bucket_bound() -> None:
    result = _result()
    summary = replace(result.summary, extra={**result.summary.extra,
                                             "server_429_p99_le_ms": 25.0,
                                             "server_429_p99_est_ms": 14.2})
    header, _, row = markdown_table([summary, result.summary]).splitlines()[:3]
    columns = [c.strip() for c in header.strip("|").split("|")]
    cells = dict(zip(columns, [c.strip() for c in row.strip("|").split("|")], strict=True))
    assert cells["429 p99 at web ms"] == "≤ 25 (~14)"
    last = markdown_table([result.summary]).splitlines()[2]
    assert "| – |" in last
