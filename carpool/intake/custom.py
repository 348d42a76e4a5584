"""Inputs of ``kind = "python"`` models: checked against the model's own JSON Schema.

The web never imports a user's handler (it would bring torch): the catalogue
carries the handler's input schema, and this module validates each input with
it, then measures the input to pick its bin (``measure_field``; see
``carpool.core.catalogue.ModelSpec``). The schema is the one ``GET /openapi.json``
publishes, so the document and the check cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError, InvalidInput

#: Characters of a schema error quoted back: jsonschema quotes the offending value,
#: which may be a whole input.
MAX_ERROR_CHARS = 300
#: Models whose validators are kept built (a process serves one catalogue).
MAX_CACHED_VALIDATORS = 256


def _hashable(spec: ModelSpec) -> str:
    return json.dumps(spec.input_schema, sort_keys=True)


@lru_cache(maxsize=MAX_CACHED_VALIDATORS)
def _validator(schema_json: str) -> Any:
    # Imported on first use (~60 ms): a web serving only built-in models never pays it.
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def check_schema(spec: ModelSpec) -> None:
    """Refuse, at start-up, a python model whose input_schema is not a valid schema."""
    import jsonschema

    try:
        _validator(_hashable(spec))
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"model {spec.name!r}: input_schema is not a valid JSON Schema: "
                          f"{exc.message[:MAX_ERROR_CHARS]}") from None


def validate(spec: ModelSpec, raw: Any) -> None:
    """Raise ``InvalidInput`` naming the first place ``raw`` breaks the model's schema."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(_hashable(spec)).iter_errors(raw))
    if error is None:
        return
    where = "input" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}"
                              for p in error.absolute_path)
    raise InvalidInput(f"{where}: {error.message[:MAX_ERROR_CHARS]} "
                       f"(see the model's input schema in GET /openapi.json)")


def measure(spec: ModelSpec, raw: Any, input_json: str,
            count_tokens: Callable[[ModelSpec, str], int]) -> int:
    """The input's size in the model's measure, which picks its bin."""
    if spec.measure == "bytes":
        return len(input_json.encode())
    if not isinstance(raw, Mapping) or spec.measure_field not in raw:
        raise InvalidInput(f"input must be an object with the key {spec.measure_field!r}")
    value = raw[spec.measure_field]
    if spec.measure == "tokens":
        if not isinstance(value, str):
            raise InvalidInput(f"input.{spec.measure_field} must be a string")
        return count_tokens(spec, value)
    if isinstance(value, bool):
        raise InvalidInput(f"input.{spec.measure_field} must be an integer, string or array")
    if isinstance(value, int):
        if value < 0:
            raise InvalidInput(f"input.{spec.measure_field} must be >= 0, got {value}")
        return value
    if isinstance(value, str | list):
        return len(value)
    raise InvalidInput(f"input.{spec.measure_field} must be an integer, string or array")
