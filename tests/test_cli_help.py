"""`carpool --help` and every subcommand's help: each command listed, each flag
explained with its default, and `carpool bench --help` written for a user."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from carpool.bench.cli import build_parser
from carpool.cli import main, parser


def subparsers(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in p._actions:  # argparse has no public way to walk its subcommands
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_carpool_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("up", "submit", "result", "calibrate", "bench"):
        assert f"    {command} " in out or f"    {command}\n" in out, command
    assert {name for name, _ in subparsers(parser())} == {
        "up", "submit", "result", "calibrate", "bench"}


@pytest.mark.parametrize("root", [parser, build_parser], ids=["carpool", "carpool-bench"])
def test_every_flag_of_every_command_says_what_it_does(
        root: type[argparse.ArgumentParser]) -> None:
    for name, sub in subparsers(root()):
        for action in sub._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, f"{name} {action.option_strings[0]} has no help"


def test_flag_help_shows_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "the web tier's port (default: 8000)" in out
    assert "Celery workers to start (default: 1)" in out


def test_bench_help_is_written_for_a_user(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "Load generator and benchmarks" in out
    assert "argument parsing only" not in out and "``" not in out
