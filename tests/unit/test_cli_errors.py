"""A command line the `carpool` command cannot act on ends with one line that says why
(`carpool: ...`, or argparse's usage error) and a non-zero exit, never a traceback; and
`carpool batch results` checks where it writes before it waits for the batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.cli import main
from tests.support.scripted import Answer, Asked, scripted


def nothing_expected(_n: int, _asked: Asked) -> Answer:
    return Answer(500, b"no request was expected")


def test_submit_of_a_missing_file_says_which(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    with scripted(nothing_expected) as server:
        code = main(["submit", "--file", str(tmp_path / "nope.jpg"), "--url", server.url])
        assert server.requests() == []
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("carpool: cannot read --file ") and "nope.jpg" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("content", "says"), [
    (None, "cannot read"),
    (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', "line 2 is not UTF-8"),
])
def test_batch_submit_of_a_missing_or_non_utf8_file_says_why(
        content: bytes | None, says: str, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_bytes(content)
    with scripted(nothing_expected) as server:
        code = main(["batch", "submit", str(path), "--model", "synthetic", "--url",
                     server.url])
        assert server.requests() == []
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("carpool: ") and says in err, err


@pytest.mark.parametrize("flag", ["-o", "--errors"])
def test_batch_results_into_a_missing_folder_fails_before_waiting(
        flag: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    paths = {"-o": tmp_path / "out.jsonl", "--errors": tmp_path / "out.errors.jsonl"}
    paths[flag] = tmp_path / "missing" / "x.jsonl"
    with scripted(nothing_expected) as server:
        code = main(["batch", "results", "batch_1", "-o", str(paths["-o"]),
                     "--errors", str(paths["--errors"]), "--url", server.url])
        assert server.requests() == []  # no wait for the batch: the check came first
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("carpool: cannot write ") and "there is no folder" in err, err


@pytest.mark.parametrize(("flags", "says"), [
    (["--sizes", "abc"], "'abc' is not a whole number"),
    (["--sizes", "1,0,4"], "0 is not at least 1"),
    (["--reps", "0"], "0 is not at least 1"),
    (["--reps", "x"], "'x' is not a whole number"),
])
def test_calibrate_refuses_sizes_and_reps_it_cannot_use(
        flags: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["calibrate", "synthetic", *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"argument {flags[0]}: " in err and says in err and "Traceback" not in err


def test_an_os_error_no_command_checked_is_one_line_not_a_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def completed(_n: int, asked: Asked) -> Answer:
        if asked.path.endswith("/content"):
            return Answer(200, b'{"custom_id": "line-1"}\n')
        return Answer(200, b'{"id": "batch_1", "status": "completed", "output_file_id": '
                      b'"file_1", "request_counts": {"total": 1, "completed": 1}}',
                      {"Content-Type": "application/json"})

    with scripted(completed) as server:  # /dev/full: writable, and every write fails
        code = main(["batch", "results", "batch_1", "-o", "/dev/full", "--errors",
                     str(tmp_path / "e.jsonl"), "--url", server.url])
    err = capsys.readouterr().err
    assert code == 2 and "carpool: [Errno 28]" in err and "Traceback" not in err, err
