"""A load's config override (Triton's ``parameters.config``): one model's catalogue entry
as JSON, read exactly as its ``[models.<m>]`` table in the catalogue file is, over the
entry in force (so ``{"options": {"weights": "/models/v2.pt"}}`` keeps every other
option). The web checks it before it stores it; each worker applies it to its own
catalogue entry when it loads the model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from carpool.core.catalogue import ModelSpec, validate
from carpool.core.catalogue import _model_from as model_from  # the TOML table's reader
from carpool.core.errors import ConfigError, InvalidInput
from carpool.core.strict_json import parse_json


def canonical(doc: Mapping[str, Any]) -> str:
    """One text per override: compact JSON, keys sorted ("" for none), so two loads
    of the same entry compare equal in Redis."""
    return json.dumps(doc, separators=(",", ":"), sort_keys=True) if doc else ""


def parse_override(config: object) -> dict[str, Any]:
    """The override as a JSON object: ``config`` is its JSON text (as tritonclient
    sends it) or the object itself; ConfigError naming what is wrong."""
    if isinstance(config, str):
        try:  # surrogatepass: a lone surrogate ("\ud800") is then bytes JSON refuses
            config = parse_json(config.encode(errors="surrogatepass"), "the override")
        except InvalidInput as exc:  # not JSON, NaN, nested too deeply, too many values
            raise ConfigError(str(exc)) from None
    if not isinstance(config, dict):
        raise ConfigError('must be a JSON object: a catalogue entry such as {"options": '
                          '{"weights": "/models/m.pt"}}')
    return config


def overridden(base: ModelSpec, doc: Mapping[str, Any]) -> ModelSpec:
    """``base`` with the override applied and validated as the catalogue file's entries
    are; ConfigError naming the problem."""
    if not doc:
        return base
    if not isinstance(doc.get("options", {}), Mapping):
        raise ConfigError(f"model {base.name!r}: options must be an object")
    try:
        spec = model_from(base.name, doc, base)
        validate(spec)
    except (TypeError, ValueError, AttributeError) as exc:  # a value of the wrong type
        raise ConfigError(f"model {base.name!r}: {exc}") from None
    return spec


def apply_stored(base: ModelSpec, stored: str) -> ModelSpec:
    """``base`` with an override as stored (``canonical``'s text; "" none), read as it was
    written: one stored before the web parsed overrides strictly may hold NaN."""
    return overridden(base, parse_override(json.loads(stored))) if stored else base
