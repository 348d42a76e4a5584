"""Plots of a sweep: p50, p99 and throughput against offered load, per pattern."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from carpool.core.extras import pyplot
from carpool.sim.compare import Row


def plot_sweep(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """One PNG per pattern; returns their paths."""
    plt = pyplot()  # the bench extra's matplotlib, on the Agg backend

    paths = []
    for pattern in sorted({r.pattern for r in rows}):
        mine = [r for r in rows if r.pattern == pattern]
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for policy in dict.fromkeys(r.policy for r in mine):
            pts = sorted((r.load * 100, r.summary) for r in mine if r.policy == policy)
            x = [p[0] for p in pts]
            axes[0].plot(x, [s.p50_ms for _, s in pts], marker="o", label=policy)
            axes[1].plot(x, [s.p99_ms for _, s in pts], marker="o", label=policy)
            axes[2].plot(x, [s.throughput_per_s for _, s in pts], marker="o", label=policy)
        for ax, title in zip(axes, ("p50 latency (ms)", "p99 latency (ms)", "throughput (jobs/s)"),
                             strict=True):
            ax.set_title(title)
            ax.set_xlabel("offered load (% of capacity)")
            ax.grid(True, alpha=0.3)
        axes[0].set_yscale("log")
        axes[1].set_yscale("log")
        axes[1].legend(fontsize=8)
        fig.suptitle(f"carpool simulator: {pattern} arrivals")
        fig.tight_layout()
        path = out_dir / f"sim-{pattern}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
