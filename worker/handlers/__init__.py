"""Model handlers, by catalogue kind. Torch-backed handlers are imported lazily,
so a worker that serves only `synthetic` starts without loading torch."""

from __future__ import annotations

import importlib

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.kinds import KINDS, kind_of
from carpool.core.settings import Settings
from worker.handlers.base import ModelHandler

#: Kinds whose handlers run torch models (and so want the torch executor).
TORCH_KINDS = frozenset(k.name for k in KINDS.values() if k.torch)


def resolve_device(setting: str) -> str:
    """The torch device a setting names: "auto" is CUDA when there is one, else the CPU."""
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"CARPOOL_DEVICE={setting!r} but torch sees no CUDA device")
    return setting


def make_handler(spec: ModelSpec, settings: Settings) -> ModelHandler:
    """The handler that serves ``spec``, not yet loaded: its kind's ``handler``
    (carpool/core/kinds.py), imported now."""
    module, _, function = kind_of(spec).handler.partition(":")
    factory = getattr(importlib.import_module(module), function)
    handler: ModelHandler = factory(spec, settings)
    return handler


__all__ = ["TORCH_KINDS", "ModelHandler", "make_handler", "resolve_device"]
