"""A model's ``options`` (its catalogue entry's table, over which a load's override is
merged) read as the type the web needs: a wrong type is a ConfigError naming the
option, so a load's override answers 400 (and a bad catalogue file stops the start
with that message) instead of a ValueError from ``int()`` deep inside, a 500."""

from __future__ import annotations

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError


def int_option(spec: ModelSpec, name: str, default: int) -> int:
    """``spec.options[name]`` as an integer (``default`` when absent), read as ``int()``
    reads it; ConfigError naming the option when it is not one."""
    value = spec.options.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: TOML's inf
        raise ConfigError(f"model {spec.name!r}: options.{name} must be an integer, not "
                          f"{value!r:.40}") from None
