"""A generic tensor model for carpool: any TorchScript or ``torch.export`` file
whose forward takes one float tensor ``[batch, *shape]`` and returns one tensor
``[batch, ...]``.

Catalogue entry (see ``catalogue.toml`` beside this file)::

    [models.tensor]
    kind = "python"
    handler = "tensor_model:TensorModel"
    measure = "bytes"
    input_schema = "schema.json"
    [models.tensor.options]
    weights = "/models/mlp.pt2"   # TorchScript (.pt) or torch.export (.pt2)
    shape = [16]                  # one item's shape

Input ``{"tensor": [...]}`` (nested lists of numbers of ``shape``); result
``{"output": [...]}``, the model's row for that item.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError, InvalidInput
from worker.handlers.torchload import load_module
from worker.handlers.tuning import HandlerContext


class TensorModel:
    def __init__(self, spec: ModelSpec, context: HandlerContext) -> None:
        self.spec = spec
        self.context = context
        shape = spec.options.get("shape")
        if not isinstance(shape, list) or not all(isinstance(n, int) and n > 0 for n in shape):
            raise ConfigError(f"model {spec.name!r}: options.shape must be a list of sizes")
        self.shape = tuple(shape)
        self.model: torch.nn.Module | None = None

    def load(self) -> None:
        def no_architecture() -> torch.nn.Module:
            raise ConfigError(f"model {self.spec.name!r}: weights must be a TorchScript or "
                              "torch.export file (a state dict needs an architecture)")

        # carpool's loader: TorchScript or .pt2 by content, never from the network.
        self.model = self.context.prepare(load_module(self.spec, no_architecture))

    def preprocess(self, job_input: Any) -> torch.Tensor:
        # On a preprocessing thread; raising InvalidInput fails this job alone.
        try:
            item = torch.tensor(job_input["tensor"], dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"input.tensor is not a numeric array: {exc}") from None
        if tuple(item.shape) != self.shape:
            raise InvalidInput(f"input.tensor has shape {list(item.shape)}; "
                               f"this model takes {list(self.shape)}")
        return item

    def example(self, bin_spec: BinSpec) -> torch.Tensor:
        return torch.zeros(self.shape)

    def collate(self, items: Sequence[torch.Tensor], bin_spec: BinSpec) -> torch.Tensor:
        # Every item has one shape, so the bin's shape is the item's: stack them (CPU);
        # carpool copies the batch to the device.
        return torch.stack(list(items))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        assert self.model is not None, "load() first"
        out: torch.Tensor = self.model(batch)
        return out.float()  # autocast may hand back fp16/bf16; results are plain floats

    def postprocess(self, output: torch.Tensor, n: int) -> list[Any]:
        return [{"output": [round(v, 6) for v in row]} for row in output.tolist()]
