"""How deep a job's input may nest, and how many items one of its arrays or objects
may hold: checked at the web before a job is queued, so the web refuses with a 400
what a worker could not take apart.

Python's recursion limit is about 1,000 frames, and a handler that walks its input
spends one or more frames per level: a 900-deep input passes Python's parser, yet
fails such a handler (``RecursionError``). The check walks without recursing, and
stops at the first place over a limit, which its message names
(``input.value[0][0]...``).

A string's length is not limited here: a model's ``max_input_bytes`` bounds its
whole input (and a text model's ``max_chars`` its text), and the request's body
limit bounds it before that. An image as base64 is one long string by design.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from carpool.core.errors import InputOverLimit

#: Arrays and objects nested in one input, the input itself counted: far above any
#: built-in model's input (a /v2 row nests at most 8), far below the recursion limit.
DEFAULT_MAX_DEPTH = 32
#: Items in one array or object of an input: a flat 512×512 tensor (262,144 values)
#: fits; a model's max_input_bytes usually ends an input before this does.
DEFAULT_MAX_ITEMS = 1 << 18
#: Characters of one object key shown in a path.
_KEY_CHARS = 40
#: Characters of a path shown at most (its end: where the limit was passed).
_PATH_CHARS = 200


@dataclass(frozen=True)
class InputLimits:
    """``CARPOOL_MAX_INPUT_DEPTH`` and ``CARPOOL_MAX_INPUT_ITEMS``."""

    max_depth: int = DEFAULT_MAX_DEPTH
    max_items: int = DEFAULT_MAX_ITEMS


def check_input(value: Any, limits: InputLimits, name: str = "input") -> None:
    """Raise InputOverLimit at the first array or object of ``value`` nested deeper
    than ``limits.max_depth``, or holding more than ``limits.max_items`` items;
    ``name`` is what the message calls ``value``.

    One level at a time, without recursing; the place of what broke a limit is
    looked for only then (_path_to), so a valid input costs one pass over its
    arrays and objects.
    """
    level = [value] if _nests(value) else []
    depth = 1
    while level:
        if depth > limits.max_depth:
            raise InputOverLimit(
                f"{_path_to(value, level[0], name)} is nested {depth} deep: an input may "
                f"nest at most {limits.max_depth} levels of arrays and objects "
                "(CARPOOL_MAX_INPUT_DEPTH)")
        below: list[Any] = []
        for node in level:
            if len(node) > limits.max_items:
                kind = "array" if isinstance(node, list) else "object"
                raise InputOverLimit(
                    f"{_path_to(value, node, name)} is an {kind} of {len(node)} items: at "
                    f"most {limits.max_items} per array or object (CARPOOL_MAX_INPUT_ITEMS)")
            below += [v for v in (node.values() if isinstance(node, dict) else node)
                      if _nests(v)]
        level = below
        depth += 1


def _nests(value: Any) -> bool:
    return isinstance(value, list | dict)


def _path_to(root: Any, target: Any, name: str) -> str:
    """``input.value[0]["a b"]``: where ``target`` (an array or object, found by
    identity) sits in ``root``, a path cut to its last _PATH_CHARS characters."""
    todo: list[tuple[Any, str]] = [(root, name)]
    while todo:
        node, path = todo.pop()
        if node is target:
            return path if len(path) <= _PATH_CHARS else "..." + path[-_PATH_CHARS:]
        items = node.items() if isinstance(node, dict) else enumerate(node)
        todo.extend((v, path + _step(k)) for k, v in items if _nests(v))
    return name


def _step(key: str | int) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    if key.isidentifier():
        return f".{key[:_KEY_CHARS]}"
    return f"[{json.dumps(key[:_KEY_CHARS])}]"
