"""`carpool --help` and every subcommand's help: each command listed, each flag
explained with its default, and `carpool bench --help` written for a user."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from carpool.bench.cli import build_parser
from carpool.cli import main, parser
from carpool.sim.cli import build_parser as simulate_parser


def subparsers(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in p._actions:  # argparse has no public way to walk its subcommands
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_carpool_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    commands = ("up", "submit", "result", "audit", "calibrate", "bench", "status", "models",
                "cancel", "watch", "batch")
    for command in commands:
        assert f"    {command} " in out or f"    {command}\n" in out, command
    assert {name for name, _ in subparsers(parser())} == set(commands)


@pytest.mark.parametrize("root", [parser, build_parser, simulate_parser],
                         ids=["carpool", "carpool-bench", "carpool-bench-simulate"])
def test_every_flag_of_every_command_says_what_it_does(
        root: type[argparse.ArgumentParser]) -> None:
    top = root()
    nested = [pair for _, sub in subparsers(top) for pair in subparsers(sub)]  # carpool batch
    for name, sub in [(top.prog, top), *subparsers(top), *nested]:
        for action in sub._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, f"{name} {action.option_strings[0]} has no help"


def test_flag_help_shows_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    # --port's default is None (a free port when 8000 is taken): its help names 8000.
    assert "the web tier's port (default 8000, or a free one if taken)" in out
    assert "(default: None)" not in out
    assert "one per GPU where there are GPUs) (default: 1)" in out
    demo = "--demo send one job and one image through once it is up"
    assert demo in out and f"{demo} (" not in out


def test_a_zero_default_is_shown_like_any_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "simulate", "--help"])
    assert "real run) (default: 0.0)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("argv", "says"), [
    (["bench", "--help"], "Load generator and benchmarks"),
    (["bench", "simulate", "--help"], "Compare batching policies in the simulator")])
def test_bench_help_is_written_for_a_user(
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    out = capsys.readouterr().out
    assert says in out
    assert "argument parsing only" not in out and "``" not in out
