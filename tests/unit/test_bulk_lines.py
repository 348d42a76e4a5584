"""A batch input file checked whole: each bad line named by its number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carpool.core.catalogue import Catalogue, load_catalogue
from carpool.core.input_limits import InputLimits
from carpool.intake.bulk_lines import MAX_ERRORS, parse_file
from tests.support.bulk import CATALOGUE_TOML, embedding_lines


@pytest.fixture
def catalogue(tmp_path: Path) -> Catalogue:
    (tmp_path / "c.toml").write_text(CATALOGUE_TOML)
    return load_catalogue(tmp_path / "c.toml")


def line(custom_id: str = "a", **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "hemb", "input": "hi", **body}})


def errors_of(data: bytes, catalogue: Catalogue, max_lines: int = 100) -> list[tuple[int, str]]:
    parsed = parse_file(data, "/v1/embeddings", catalogue, InputLimits(), max_lines)
    return [(e["line"], e["message"]) for e in parsed.errors]


def test_a_good_file_gives_one_line_per_request_each_with_its_jobs(catalogue: Catalogue) -> None:
    data = (line("a") + "\n\n" + line("b", input=["x", "y"]) + "\n").encode()
    parsed = parse_file(data, "/v1/embeddings", catalogue, InputLimits(), 100)
    assert parsed.errors == [] and parsed.spec is not None and parsed.spec.name == "hemb"
    assert [(ln.index, ln.custom_id, len(ln.jobs)) for ln in parsed.lines] == [
        (0, "a", 1), (1, "b", 2)]


@pytest.mark.parametrize(("raw", "says"), [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"custom_id": "a"}', "missing"),
    (line(extra=1).encode(), "unknown field"),
    (line(model="nope").encode(), "unknown model"),
    (line(input="").encode(), "non-empty"),
    (line(input=[]).encode(), "non-empty"),
    (line(input=[1, 2]).encode(), "list of strings"),
    (line(encoding_format="hex").encode(), "encoding_format"),
    (line(dimensions=True).encode(), "'dimensions' must be a positive integer, not true"),
    (line(dimensions=0).encode(), "positive integer"),
    (line(dimensions="8").encode(), "positive integer"),
    (json.dumps({"custom_id": "", "method": "POST", "url": "/v1/embeddings",
                 "body": {}}).encode(), "custom_id"),
    (json.dumps({"custom_id": "a" * 513, "method": "POST", "url": "/v1/embeddings",
                 "body": {}}).encode(), "custom_id"),
    (json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/embeddings",
                 "body": {}}).encode(), "method"),
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                 "body": {}}).encode(), "endpoint"),
    (b'{"custom_id": "\xff"}', "UTF-8"),
    (b"[" * 100_000, "JSON"),
    (line(input="x" * 5000).encode(), "characters"),
    (line(input="x" * (8 << 20)).encode(), "characters"),  # one 8 MB line
    (b'{"a": NaN}', "JSON"),
])
def test_each_malformed_line_is_named_by_its_line_number(
        raw: bytes, says: str, catalogue: Catalogue) -> None:
    data = line("ok").encode() + b"\n" + raw + b"\n"
    (number, message), = errors_of(data, catalogue)
    assert number == 2 and says in message


def test_a_repeated_custom_id_fails_its_second_line(catalogue: Catalogue) -> None:
    errors = errors_of((line("a") + "\n" + line("a") + "\n").encode(), catalogue)
    assert errors == [(2, "custom_id 'a' is used by an earlier line: each must be unique")]


def test_lines_of_two_models_fail_the_second(catalogue: Catalogue) -> None:
    other = line("b", model="minilm")
    (number, message), = errors_of((line("a") + "\n" + other).encode(), catalogue)
    assert number == 2 and "one model" in message


def test_more_lines_than_the_limit_fail_the_file(catalogue: Catalogue) -> None:
    (number, message), = errors_of(embedding_lines(4), catalogue, max_lines=3)
    assert number == 4 and "more than 3" in message


def test_an_empty_file_fails(catalogue: Catalogue) -> None:
    assert errors_of(b"\n\n", catalogue) == [(None, "the file has no requests")]


def test_errors_stop_at_the_cap_and_say_more_follow(catalogue: Catalogue) -> None:
    errors = errors_of(b"x\n" * 500, catalogue)
    assert len(errors) == MAX_ERRORS + 1 and "more errors follow" in errors[-1][1]


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
_line_doc = st.fixed_dictionaries({}, optional={
    "custom_id": _json, "method": st.sampled_from(["POST", "GET"]) | _json,
    "url": st.sampled_from(["/v1/embeddings", "/submit"]) | _json,
    "body": st.fixed_dictionaries({}, optional={"model": st.sampled_from(["hemb", "x"]) | _json,
                                                "input": _json,
                                                "encoding_format": _json})})


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(_line_doc.map(json.dumps), st.binary(max_size=60).map(
    lambda b: b.decode("latin-1"))), max_size=6))
def test_any_file_is_either_runnable_or_fails_with_numbered_errors(
        catalogue: Catalogue, raw_lines: list[str]) -> None:
    data = "\n".join(raw_lines).encode("utf-8", "surrogateescape")
    parsed = parse_file(data, "/v1/embeddings", catalogue, InputLimits(), 100)
    assert parsed.errors or parsed.lines  # never an exception, never nothing said
    for error in parsed.errors:
        assert error["message"] and (error["line"] is None or error["line"] >= 1)


def test_a_submit_line_nested_past_the_input_depth_is_named_by_its_line_number(
        catalogue: Catalogue) -> None:
    def submit_line(custom_id: str, value: bytes) -> bytes:
        head = {"custom_id": custom_id, "method": "POST", "url": "/submit",
                "body": {"model": "synthetic", "input": {"value": "VALUE", "size": 1}}}
        return json.dumps(head).encode().replace(b'"VALUE"', value)

    data = (submit_line("a", b"[[1]]") + b"\n"
            + submit_line("b", b"[" * 900 + b"]" * 900) + b"\n")
    parsed = parse_file(data, "/submit", catalogue, InputLimits(max_depth=3, max_items=10), 100)
    [(number, message)] = [(e["line"], e["message"]) for e in parsed.errors]
    assert number == 2
    assert message.startswith("input.value[0][0] is nested 4 deep")
    assert "CARPOOL_MAX_INPUT_DEPTH" in message


def test_a_submit_lines_webhook_is_checked_for_form_but_not_its_address(
        catalogue: Catalogue) -> None:
    """It is never called (the batch's webhook is): a private address does not fail the
    batch, a URL that is not one does."""
    def line(custom_id: str, webhook: str) -> bytes:
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/submit",
                           "body": {"model": "synthetic", "input": {"value": 1, "size": 1},
                                    "webhook": webhook}}).encode() + b"\n"

    parsed = parse_file(line("a", "http://10.0.0.5/hook") + line("b", "ftp://x/"), "/submit",
                        catalogue, InputLimits(), 100)
    assert [e["line"] for e in parsed.errors] == [2]


@pytest.mark.parametrize("raw", [b"\x00", b'{"custom_id": "a", 1e999}', b"[" * 100_000,
                                 b"," * 600_000])
def test_a_line_that_is_not_json_is_called_a_line_not_a_request_body(
        raw: bytes, catalogue: Catalogue) -> None:
    (number, message), = errors_of(line("ok").encode() + b"\n" + raw + b"\n", catalogue)
    assert number == 2 and message.startswith("the line ") and "request body" not in message
