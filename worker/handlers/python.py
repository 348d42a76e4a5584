"""``kind = "python"``: a model served by the user's own handler class.

The catalogue names the class (``handler = "mypkg.module:MyHandler"``); the
worker imports it (the web never does: it checks inputs with the model's
``input_schema``), constructs it with the model's spec and a ``HandlerContext``,
and runs it through the same executor as the built-in models. ``PythonModel``
adds what carpool promises every model: the forward pass under the model's
autocast, 4-D inputs channels-last when asked.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError, HandlerContractError
from carpool.core.settings import Settings
from worker.handlers.tuning import HandlerContext

#: What a handler class must define (worker.handlers.base.ModelHandler).
REQUIRED_METHODS = ("load", "preprocess", "example", "collate", "forward", "postprocess")


def import_handler(spec: ModelSpec) -> type:
    """The class ``spec.handler`` names; a start-up error that says what is wrong."""
    module_name, _, attr = spec.handler.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"model {spec.name!r}: cannot import {module_name!r} for handler "
                          f"{spec.handler!r}: {exc} (is its package installed, or on "
                          "PYTHONPATH, where the worker runs?)") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ConfigError(f"model {spec.name!r}: {module_name!r} has no class {attr!r}")
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(f"model {spec.name!r}: handler {spec.handler!r} lacks "
                          f"{', '.join(missing)} (see worker/handlers/base.py)")
    return cls


class PythonModel:
    """A user's handler, behind carpool's handler interface."""

    def __init__(self, spec: ModelSpec, context: HandlerContext) -> None:
        self.spec = spec
        self.context = context
        self.handler: Any = import_handler(spec)(spec, context)

    def load(self) -> None:
        self.handler.load()

    def preprocess(self, job_input: Any) -> Any:
        return self.handler.preprocess(job_input)

    def example(self, bin_spec: BinSpec) -> Any:
        return self.handler.example(bin_spec)

    def collate(self, items: Sequence[Any], bin_spec: BinSpec) -> Any:
        return self.handler.collate(items, bin_spec)

    def forward(self, batch: Any) -> Any:
        with self.context.autocast():
            return self.handler.forward(self.context.inputs(batch))

    def postprocess(self, output: Any, n: int) -> list[Any]:
        results = self.handler.postprocess(output, n)
        # list() of a dict is its keys and of a string its characters: with as many as
        # the batch has items, each job got one as its result, "done". Those, None and
        # what is not iterable break the contract (the batch fails, nothing is split).
        if results is None or isinstance(results, str | bytes | bytearray | Mapping) \
                or not isinstance(results, Iterable):
            raise HandlerContractError(
                f"handler for {self.spec.name!r} returned a {type(results).__name__} from "
                f"postprocess, not a list with one result per item ({n}), in order")
        return list(results)


def handler_for(spec: ModelSpec, settings: Settings) -> PythonModel:
    """The handler for a ``kind = "python"`` model: the user's class (carpool/core/kinds.py)."""
    from worker.handlers import resolve_device

    return PythonModel(spec, HandlerContext.of(spec, resolve_device(settings.executor.device)))
