"""The written report: a markdown table, JSON lines of every job and every summary."""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from carpool.bench.records import write_jsonl
from carpool.bench.stats import Summary
from carpool.bench.sweep import StepResult

COLUMNS = ("run", "offered /s", "achieved /s", "of limit", "p50 ms", "p95 ms", "p99 ms",
           "max ms", "queue ms", "infer ms", "batch", "429", "429 p99 ms",
           "429 p99 at web ms", "timeout", "err",
           "failed", "misrouted", "lost", "gen. late p99 ms")


def _f(x: float | None, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def row(s: Summary) -> list[str]:
    limit = s.extra.get("limit_per_s")
    # A backlog has no offered rate; its throughput is the steady rate on Redis's clock.
    rate = s.achieved_rate if s.offered_rate else (s.steady_rate or s.achieved_rate)
    share = f"{rate / limit:.0%}" if isinstance(limit, float) and limit else "–"
    offered = _f(s.offered_rate) if s.offered_rate else f"backlog {s.jobs}"
    c = s.counts
    return [s.label, offered, _f(rate), share, _f(s.e2e_ms.p50, 1), _f(s.e2e_ms.p95, 1),
            _f(s.e2e_ms.p99, 1), _f(s.e2e_ms.max, 1), _f(s.split_ms["queue"], 1),
            _f(s.split_ms["inference"], 1), _f(s.mean_batch, 1), str(c["rejected"]),
            _f(s.rejected_p99_ms, 1), _server_429(s), str(c["timeout"]), str(c["error"]),
            str(c["failed"]),
            str(c["misrouted"]), str(c["lost"]),
            _f(s.lateness_p99_ms, 1)]


def _server_429(s: Summary) -> str:
    """The web's own p99 for the step's 429s: a bucket's upper bound, hence "≤",
    and (~) the estimate interpolated within that bucket."""
    bound = s.extra.get("server_429_p99_le_ms")
    if not isinstance(bound, float) or math.isnan(bound):
        return "–"
    if math.isinf(bound):
        return "> 60 s"
    estimate = s.extra.get("server_429_p99_est_ms")
    interpolated = f" (~{estimate:.0f})" if isinstance(estimate, float) else ""
    return f"≤ {bound:g}{interpolated}"


def markdown_table(summaries: Sequence[Summary]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(s)) + " |" for s in summaries]
    return "\n".join(lines)


def summary_json(s: Summary) -> dict[str, Any]:
    out = asdict(s)
    out["mean_batch"] = None if math.isnan(s.mean_batch) else s.mean_batch
    out["delivered"] = s.delivered
    return out


def machine() -> str:
    import os

    return f"{platform.node()}: {os.cpu_count()} CPUs, {platform.system()} " \
           f"{platform.release()}, Python {platform.python_version()}"


def write_outputs(out: Path, results: Sequence[StepResult], header: str,
                  notes: Sequence[str] = ()) -> Path:
    """``report.md``, ``summary.jsonl`` and ``jobs.jsonl`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = [r.summary for r in results]
    write_jsonl(out / "summary.jsonl", (summary_json(s) for s in summaries))
    write_jsonl(out / "jobs.jsonl", ({"run": r.summary.label, **rec.to_json()}
                                     for r in results for rec in r.records))
    totals = {k: sum(s.counts[k] for s in summaries) for k in ("misrouted", "lost")}
    body = [header, "", markdown_table(summaries), "",
            f"Misrouted results: {totals['misrouted']}. Lost jobs: {totals['lost']}.", ""]
    body += [f"- {n}" for n in notes]
    pngs = sorted(p.name for p in out.glob("*.png"))
    body += [""] + [f"![{name}]({name})" for name in pngs]
    path = out / "report.md"
    path.write_text("\n".join(body).rstrip() + "\n")
    return path


def finish_report(out: Path, results: list[StepResult], header: str, notes: list[str]) -> int:
    """Write the report, print its table and notes; 1 when a result was misrouted or lost."""
    report = write_outputs(out, results, header, notes)
    print(markdown_table([r.summary for r in results]))
    for note in notes:
        print(f"- {note}")
    print(f"report: {report}")
    bad = sum(r.summary.counts["misrouted"] + r.summary.counts["lost"] for r in results)
    if bad:
        print(f"carpool bench: {bad} misrouted or lost results", file=sys.stderr)
    return 1 if bad else 0
