"""One source for process command lines: carpool/stack/commands.toml, shipped as package data."""

from __future__ import annotations

import sys
import tomllib

from carpool.stack.command_lines import argv, python_argv
from carpool.stack.localstack import flower_command, web_command, worker_command
from tests.support.procs import REPO_ROOT


def test_the_command_file_is_package_data() -> None:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["carpool.stack"]
    assert "commands.toml" in data
    assert not (REPO_ROOT / "ops" / "commands.toml").exists()  # no second copy to drift


def test_carpool_up_runs_the_shipped_command_lines() -> None:
    assert web_command() == [sys.executable, "-m", *argv("web")]
    shipped_worker = argv("worker", node="worker3@%h")
    assert worker_command(3) == [sys.executable, "-m", *shipped_worker, "--loglevel", "INFO"]
    assert "--concurrency" in shipped_worker and "--pool" in shipped_worker
    assert flower_command(5600)[:len(python_argv("flower"))] == python_argv("flower", port=5600)
    assert "--port=5600" in flower_command(5600)
