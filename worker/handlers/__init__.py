"""Model handlers, by catalogue kind. Torch-backed handlers are imported lazily,
so a worker that serves only `synthetic` starts without loading torch."""

from __future__ import annotations

from carpool.catalogue import ModelSpec
from carpool.errors import ConfigError
from carpool.settings import Settings
from worker.handlers.base import ModelHandler


def make_handler(spec: ModelSpec, settings: Settings) -> ModelHandler:
    """The handler that serves ``spec``, not yet loaded."""
    if spec.kind == "synthetic":
        from worker.handlers.synthetic import SyntheticHandler

        return SyntheticHandler(spec, settings.synthetic_cost_ms, settings.synthetic_poison)
    raise ConfigError(f"model {spec.name!r}: no handler for kind {spec.kind!r}")


__all__ = ["ModelHandler", "make_handler"]
