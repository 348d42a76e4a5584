"""The generator's own ceiling: how many jobs/s it can drive against a trivial server.

The far end is ``carpool.bench.stub`` in its own process, answering the job API
at once, so everything the generator does per job (a submit, a long-poll, JSON,
the echo and checksum check) is what runs out first. Rates double until one is
no longer kept; the ceiling is the highest rate that was.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from carpool.bench.stack import free_port
from carpool.bench.stats import Summary
from carpool.bench.sweep import Step, poisson_step, progress_bar, run_steps
from carpool.bench.target import Target
from carpool.bench.workload import SizeMix, new_nonce

#: A rate is kept when this share of it is delivered ...
MIN_DELIVERED = 0.95
#: ... and 99 % of jobs start no later than this after their scheduled time.
MAX_LATENESS_MS = 10.0
DEFAULT_RATES = (250.0, 500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 6000.0)
#: Bound on the stub's exit once told to stop.
STUB_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Ceiling:
    rate: float
    points: list[Summary]


def kept(s: Summary) -> bool:
    """Whether the generator kept up with this step's schedule."""
    return (s.delivered >= MIN_DELIVERED and s.lateness_p99_ms <= MAX_LATENESS_MS
            and s.counts["ok"] == s.jobs)


@contextmanager
def stub_server() -> Iterator[str]:
    """Start the stub in its own process; yield its base URL."""
    port = free_port()
    with subprocess.Popen([sys.executable, "-m", "carpool.bench.stub", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # returns once it listens, or b"" if it died
            if b"listening" not in line:
                raise RuntimeError(f"the stub server did not start: {line!r}")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(STUB_STOP_TIMEOUT_S)


def measure_ceiling(rates: Sequence[float] = DEFAULT_RATES, duration_s: float = 3.0,
                    url: str = "", seed: int = 1) -> Ceiling:
    """Drive each rate in turn until one is not kept; against ``url`` or a fresh stub."""
    sizes = SizeMix.parse("16")
    points: list[Summary] = []
    best = 0.0
    with stub_server() if not url else _given(url) as base_url:
        target = Target("generator", "http", base_url)
        bar = progress_bar(int(sum(rates) * duration_s))
        for i, rate in enumerate(rates):
            step: Step = poisson_step(f"{rate:g}/s", rate, duration_s, sizes, seed + i)
            (result,) = run_steps(target, [step], new_nonce(), grace_s=10.0, bar=bar)
            points.append(result.summary)
            if not kept(result.summary):
                break
            best = rate
        bar.close()
    return Ceiling(best, points)


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url
