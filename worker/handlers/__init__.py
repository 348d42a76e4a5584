"""Model handlers, by catalogue kind. Torch-backed handlers are imported lazily,
so a worker that serves only `synthetic` starts without loading torch."""

from __future__ import annotations

from carpool.core.catalogue import PYTHON_KIND, ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.settings import Settings
from worker.handlers.base import ModelHandler

#: Kinds whose handlers run torch models (and so want the torch executor).
TORCH_KINDS = frozenset({"image", "text", PYTHON_KIND})


def resolve_device(setting: str) -> str:
    """The torch device a setting names: "auto" is CUDA when there is one, else the CPU."""
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"CARPOOL_DEVICE={setting!r} but torch sees no CUDA device")
    return setting


def make_handler(spec: ModelSpec, settings: Settings) -> ModelHandler:
    """The handler that serves ``spec``, not yet loaded."""
    if spec.kind == "synthetic":
        from worker.handlers.synthetic import SyntheticHandler

        return SyntheticHandler(spec, settings.synthetic_cost_ms, settings.synthetic_poison,
                                call_log=settings.synthetic_call_log)
    if spec.kind == "image":
        from worker.handlers.image import ImageHandler

        return ImageHandler(spec, resolve_device(settings.executor.device))
    if spec.kind == "text":
        from worker.handlers.text import TextHandler

        return TextHandler(spec, resolve_device(settings.executor.device))
    if spec.kind == PYTHON_KIND:
        from worker.handlers.python import PythonModel
        from worker.handlers.tuning import HandlerContext

        return PythonModel(spec, HandlerContext.of(spec, resolve_device(settings.executor.device)))
    raise ConfigError(f"model {spec.name!r}: no handler for kind {spec.kind!r}")


__all__ = ["TORCH_KINDS", "ModelHandler", "make_handler", "resolve_device"]
