"""JSON from outside, parsed strictly: every request body, a bulk file's lines, a load's
config override. Here in the core, below both the web and the override reader, so that
none of them parses with a plain ``json.loads`` (which takes NaN and Infinity, and
raises RecursionError, a 500, on a deeply nested document)."""

from __future__ import annotations

import json
import math
from typing import Any

from carpool.core.errors import InvalidJson, TooManyJsonValues

#: JSON values (commas, opening brackets) in one request body: what /submit/batch's
#: many typical inputs need, while an array of that many empty objects stays ~35 MB.
MAX_JSON_VALUES = 1 << 19


def parse_json(body: bytes, name: str = "request body") -> Any:
    """The JSON document in ``body``; NaN, Infinity and absurd nesting are refused;
    ``name`` is what the messages call ``body``.

    So is a body with more than MAX_JSON_VALUES values, counted (over-counted, as
    strings may hold these characters) by its commas and opening brackets before
    anything is built: memory then stays within tens of MB whatever the body holds.
    """
    values = body.count(b",") + body.count(b"[") + body.count(b"{")
    if values > MAX_JSON_VALUES:
        raise TooManyJsonValues(
            f"{name} holds about {values} JSON values (commas and brackets); at most "
            f"{MAX_JSON_VALUES} per request: split it")
    try:
        return json.loads(body, parse_constant=_no_constants, parse_float=_finite)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidJson(f"{name} is not valid JSON: {exc}") from None
    except RecursionError:  # Python's parser recurses: about a thousand levels deep
        raise InvalidJson(f"{name} is JSON nested too deeply to parse; an input may "
                          "nest at most CARPOOL_MAX_INPUT_DEPTH levels") from None


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf, and would be stored as Infinity
        raise ValueError(f"the number {text[:40]} is out of range")
    return value
