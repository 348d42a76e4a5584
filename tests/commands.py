"""The canonical process command lines, read from ``ops/commands.toml``.

Deploy files are tested against these lists, and end-to-end tests should start
their real gunicorn, Celery worker and Flower processes with them, so that what
the tests run is what the images run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

COMMANDS_FILE = Path(__file__).resolve().parent.parent / "ops" / "commands.toml"


def load_commands(path: Path = COMMANDS_FILE) -> dict[str, list[str]]:
    """Each process name (``web``, ``worker``, ``flower``) mapped to its argv."""
    with path.open("rb") as f:
        table = tomllib.load(f)
    return {name: list(entry["argv"]) for name, entry in table.items()}


def argv(name: str) -> list[str]:
    """The argv of one process, e.g. ``argv("worker")``."""
    return load_commands()[name]
