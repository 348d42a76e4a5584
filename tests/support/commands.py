"""The canonical process command lines, read from ``carpool/stack/commands.toml``.

Deploy files are tested against these lists, and end-to-end tests start their real
gunicorn, Celery worker and Flower processes with them, so that what the tests run
is what the images run.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from carpool.stack.command_lines import argv, load_commands

COMMANDS_FILE = Path(str(files("carpool.stack").joinpath("commands.toml")))

__all__ = ["COMMANDS_FILE", "argv", "load_commands"]
