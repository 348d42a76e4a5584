"""PNG plots with matplotlib's Agg backend (no display): latency against throughput,
the batch-size histogram, and latency over time (what a burst does to the tail).
matplotlib comes with the bench extra and is imported when a plot is drawn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from carpool.bench.records import JobRecord, Outcome
from carpool.bench.stats import Summary, percentile
from carpool.core.extras import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PERCENTILE_STYLES = (("p50", ":"), ("p95", "--"), ("p99", "-"))
#: Width of one time bucket in the latency-over-time plot.
BUCKET_S = 0.5


def latency_vs_throughput(summaries: Sequence[Summary], knees: Mapping[str, Summary | None],
                          path: Path) -> Path:
    """p50/p95/p99 against achieved jobs/s, one colour per target; the knee ringed."""
    fig, ax = pyplot().subplots(figsize=(8, 5))
    targets = sorted({str(s.extra.get("target", "")) for s in summaries})
    for i, target in enumerate(targets):
        points = sorted((s for s in summaries if s.extra.get("target", "") == target),
                        key=lambda s: s.offered_rate or 0.0)
        color = f"C{i}"
        x = [s.achieved_rate for s in points]
        for name, style in PERCENTILE_STYLES:
            y = [getattr(s.e2e_ms, name) for s in points]
            ax.plot(x, y, style, marker=".", color=color, label=f"{target} {name}")
        knee = knees.get(target)
        if knee is not None:
            ax.plot([knee.achieved_rate], [knee.e2e_ms.p99], "o", ms=14, mfc="none",
                    color=color, label=f"{target} knee ({knee.achieved_rate:.0f}/s)")
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (jobs/s)")
    ax.set_ylabel("end-to-end latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def overload(summaries: Sequence[Summary], path: Path) -> Path:
    """Goodput (ok jobs/s as a fraction of the limit) and p99 against offered load
    (× the limit), one colour per target: what overload does to each policy."""
    fig, (good, tail) = pyplot().subplots(1, 2, figsize=(11, 4.5))
    targets = sorted({str(s.extra.get("target", "")) for s in summaries})
    for i, target in enumerate(targets):
        points = sorted((s for s in summaries if s.extra.get("target", "") == target
                         and isinstance(s.extra.get("limit_per_s"), float)),
                        key=lambda s: s.offered_rate or 0.0)
        limits = [float(s.extra["limit_per_s"]) for s in points]
        x = [(s.offered_rate or 0.0) / lim for s, lim in zip(points, limits, strict=True)]
        good.plot(x, [s.achieved_rate / lim for s, lim in zip(points, limits, strict=True)],
                  marker="o", color=f"C{i}", label=target)
        tail.plot(x, [s.e2e_ms.p99 for s in points], marker="o", color=f"C{i}", label=target)
    good.set_ylabel("goodput (ok within the client timeout) / limit")
    good.set_ylim(0, 1.1)
    tail.set_ylabel("p99 of ok jobs (ms)")
    for ax in (good, tail):
        ax.set_xlabel("offered load (× the analytical limit)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def batch_histogram(summaries: Sequence[Summary], path: Path) -> Path:
    """How many batches of each size, one bar series per summary."""
    fig, ax = pyplot().subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(summaries))
    for i, s in enumerate(summaries):
        sizes = sorted(s.batches)
        ax.bar([x + i * width for x in sizes], [s.batches[x] for x in sizes], width=width,
               label=f"{s.label} (mean {s.mean_batch:.1f})")
    ax.set_xlabel("batch size (jobs)")
    ax.set_ylabel("batches")
    if summaries:
        ax.legend(fontsize=7)
    return _save(fig, path)


def latency_over_time(records: Sequence[JobRecord], path: Path, title: str = "") -> Path:
    """Each job's latency at its arrival time, the p99 per bucket, and the offered rate."""
    fig, ax = pyplot().subplots(figsize=(9, 4))
    ok = [r for r in records if r.outcome is Outcome.OK and r.e2e_ms is not None]
    ax.scatter([r.t_sched for r in ok], [r.e2e_ms or 0.0 for r in ok], s=2, alpha=0.3,
               color="C0", label="job")
    n = int(max((r.t_sched for r in records), default=0.0) / BUCKET_S) + 1
    buckets = [i * BUCKET_S for i in range(n)]
    latencies: list[list[float]] = [[] for _ in buckets]
    arrivals = [0.0] * n
    for r in records:
        arrivals[int(r.t_sched / BUCKET_S)] += 1 / BUCKET_S
    for r in ok:
        latencies[int(r.t_sched / BUCKET_S)].append(r.e2e_ms or 0.0)
    p99 = [percentile(values, 99) for values in latencies]
    ax.plot([b + BUCKET_S / 2 for b in buckets], p99, color="C3", label="p99 per bucket")
    ax.set_yscale("log")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("end-to-end latency (ms)")
    rate = ax.twinx()
    rate.step(buckets, arrivals, where="post", color="grey", alpha=0.6, label="offered")
    rate.set_ylabel("offered (jobs/s)")
    rate.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
