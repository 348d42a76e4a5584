"""Helpers for the batch tests: a hash-embedder catalogue, the feeder process, waits."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from carpool.stack.waiting import wait_until
from tests.support.commands import argv
from tests.support.procs import log_says, running

#: A cheap text embedder with bins deep enough for a feeder's pacing.
CATALOGUE_TOML = """
[models.hemb]
kind = "hashembed"
measure = "tokens"
[models.hemb.options]
dim = 8
max_chars = 4000
[[models.hemb.bins]]
name = "short"
max_size = 32
max_batch = 256
max_wait_ms = 5
max_depth = 4096
[[models.hemb.bins]]
name = "long"
max_size = 2048
max_batch = 64
max_wait_ms = 5
max_depth = 4096
"""

#: A second hash embedder whose one bin takes 8 lines at a time: served by a worker
#: with a fixed cost per batch (CARPOOL_SYNTHETIC_COST_MS="100,0": at most 80 lines
#: a second), a batch of it runs in many small steps, and its speed has a ceiling that
#: no machine, loaded or idle, can pass.
SLOW_MODEL_TOML = """
[models.hslow]
kind = "hashembed"
measure = "tokens"
[models.hslow.options]
dim = 8
max_chars = 4000
[[models.hslow.bins]]
name = "all"
max_size = 2048
max_batch = 8
max_wait_ms = 5
max_depth = 4096
"""
#: The worker cost that makes ``hslow`` slow: 100 ms a batch of up to 8 lines.
SLOW_COST_MS = "100,0"
#: The most lines ``hslow`` ends per second, at SLOW_COST_MS.
SLOW_MAX_LINES_PER_S = 8 / 0.1

FEEDER_START_TIMEOUT_S = 30.0
#: A batch's final statuses.
FINAL = {"completed", "failed", "expired", "cancelled"}


def feeder_command() -> list[str]:
    _, *rest = argv("feeder")
    return [sys.executable, *rest]


@contextmanager
def start_feeder(env: dict[str, str], log_path: Path, held_at: str = "") -> Iterator[Any]:
    """The real feeder process; ready when its log says so. Its metrics endpoint is off
    unless ``env`` sets CARPOOL_FEEDER_METRICS_PORT (parallel runs would fight over 9400).
    ``held_at`` (``POINT:N``) runs it under tests/support/feeder_held.py, which holds
    it between two writes for the test to kill."""
    env = {"CARPOOL_FEEDER_METRICS_PORT": "0", **env}
    command = ([sys.executable, "-m", "tests.support.feeder_held", held_at] if held_at
               else feeder_command())
    cmd = ["bash", "-c", f'exec "$0" "$@" >>{log_path} 2>&1', *command]
    with running(cmd, env, lambda: log_says(log_path, "feeder ready"), "feeder",
                 FEEDER_START_TIMEOUT_S) as proc:
        yield proc


def embedding_lines(n: int, model: str = "hemb", prefix: str = "req") -> bytes:
    return "".join(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST",
                               "url": "/v1/embeddings",
                               "body": {"model": model, "input": f"text number {i}"}}) + "\n"
                   for i in range(n)).encode()


def wait_batch(client: Any, batch_id: str, statuses: set[str], timeout_s: float) -> Any:
    """The batch once its status is one of ``statuses``."""
    box: list[Any] = []

    def reached() -> bool:
        box[:] = [client.batches.retrieve(batch_id)]
        return bool(box[0].status in statuses)

    wait_until(reached, timeout_s, f"batch {batch_id} to be {sorted(statuses)}")
    return box[0]


def lines_of(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line.strip()]
