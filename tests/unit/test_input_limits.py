"""carpool/core/input_limits.py: an input's nesting and its arrays' and objects'
lengths, checked without recursing, each refusal naming its limit and its place."""

from __future__ import annotations

from typing import Any

import pytest

from carpool.core.errors import ConfigError, InputOverLimit, InvalidInput
from carpool.core.input_limits import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_ITEMS,
    InputLimits,
    check_input,
)
from carpool.core.settings import load_settings


def nested(depth: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``depth`` arrays, built without recursing."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def refusal(value: Any, limits: InputLimits) -> str:
    with pytest.raises(InputOverLimit) as caught:
        check_input(value, limits)
    return str(caught.value)


def test_an_input_at_the_limits_passes() -> None:
    limits = InputLimits(max_depth=4, max_items=3)
    check_input({"value": nested(3), "size": 1}, limits)  # the object, then 3 arrays
    check_input({"a": [1, 2, 3], "b": {"x": 1, "y": 2}}, limits)
    check_input({"image_b64": "A" * 1_000_000}, limits)  # a string is not items
    for scalar in (None, 1, 1.5, "text", True):
        check_input(scalar, limits)


def test_an_input_nested_past_the_depth_limit_names_the_limit_and_the_place() -> None:
    message = refusal({"value": nested(900), "size": 10}, InputLimits())
    assert message == (
        "input.value" + "[0]" * (DEFAULT_MAX_DEPTH - 1) + f" is nested {DEFAULT_MAX_DEPTH + 1}"
        f" deep: an input may nest at most {DEFAULT_MAX_DEPTH} levels of arrays and objects "
        "(CARPOOL_MAX_INPUT_DEPTH)")


def test_the_depth_counts_the_input_itself() -> None:
    limits = InputLimits(max_depth=2, max_items=10)
    check_input({"a": [1]}, limits)
    assert refusal({"a": [[1]]}, limits).startswith("input.a[0] is nested 3 deep")
    assert refusal([[{}]], InputLimits(max_depth=2, max_items=10)).startswith(
        "input[0][0] is nested 3 deep")


def test_an_array_or_object_over_the_items_limit_names_the_limit_and_the_place() -> None:
    limits = InputLimits(max_depth=8, max_items=3)
    assert refusal({"value": [0, [1, 2, 3, 4]]}, limits) == (
        "input.value[1] is an array of 4 items: at most 3 per array or object "
        "(CARPOOL_MAX_INPUT_ITEMS)")
    assert refusal({"a b": {"k1": 1, "k2": 2, "k3": 3, "k4": 4}}, limits).startswith(
        'input["a b"] is an object of 4 items')
    assert refusal(list(range(4)), limits).startswith("input is an array of 4 items")


def test_a_path_is_cut_to_its_end_and_keys_to_40_characters() -> None:
    deep = nested(100)
    message = refusal({"k" * 100: deep}, InputLimits(max_depth=90, max_items=10))
    path = message.split(" is nested")[0]
    assert path.startswith("...") and len(path) == 3 + 200 and path.endswith("[0]")
    message = refusal({"k" * 100: [[1]]}, InputLimits(max_depth=2, max_items=10))
    assert message.startswith("input." + "k" * 40 + "[0] is nested")


def test_an_input_deeper_than_the_recursion_limit_is_refused_not_a_recursion_error() -> None:
    assert "CARPOOL_MAX_INPUT_DEPTH" in refusal(nested(200_000), InputLimits())
    check_input(nested(5000), InputLimits(max_depth=6000, max_items=10))


def test_a_refusal_is_invalid_input_a_400() -> None:
    assert issubclass(InputOverLimit, InvalidInput)


def test_the_limits_are_read_from_the_environment_and_checked() -> None:
    assert load_settings({}).input_limits == InputLimits(DEFAULT_MAX_DEPTH, DEFAULT_MAX_ITEMS)
    read = load_settings({"CARPOOL_MAX_INPUT_DEPTH": "8", "CARPOOL_MAX_INPUT_ITEMS": "100"})
    assert read.input_limits == InputLimits(max_depth=8, max_items=100)
    for name in ("CARPOOL_MAX_INPUT_DEPTH", "CARPOOL_MAX_INPUT_ITEMS"):
        with pytest.raises(ConfigError, match=name):
            load_settings({name: "0"})
