"""Per-model torch options every torch handler honours, and the context a handler gets.

``options`` of a model in the catalogue may set, besides the handler's own keys:

- ``dtype``: ``"fp32"`` (default), ``"fp16"`` or ``"bf16"`` — the forward pass runs
  under ``torch.autocast`` in that dtype (weights stay fp32, so accuracy-critical
  ops such as softmax and layer norm keep fp32, as autocast decides). bf16 works on
  the CPU too; fp16 pays off only on a GPU.
- ``channels_last``: ``true`` stores the module's weights and every 4-D input batch
  in NHWC order, which cuDNN's convolutions prefer on tensor cores.
- ``compile``: ``true`` wraps the module in ``torch.compile`` (inductor); a string
  names another backend (``"eager"``, ``"aot_eager"``, ``"cudagraphs"``). The first
  batch of each new shape pays the compilation; warm-up runs each bin shape once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError
from worker.device.tensor_tree import map_tensors

#: The ``dtype`` option's values, and the autocast dtype each means (None: no autocast).
DTYPES: Mapping[str, torch.dtype | None] = {
    "fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
#: The option keys this module reads; a handler's own options must use other names.
KEYS = ("dtype", "channels_last", "compile")


@dataclass(frozen=True)
class TorchOptions:
    dtype: str = "fp32"
    channels_last: bool = False
    #: "" off; "inductor" for ``compile = true``; else the backend named.
    compile_backend: str = ""

    @classmethod
    def of(cls, spec: ModelSpec) -> TorchOptions:
        """The options ``spec`` sets, checked: a typo stops the worker at start."""
        opts = spec.options
        where = f"model {spec.name!r}"
        dtype = opts.get("dtype", "fp32")
        if dtype not in DTYPES:
            raise ConfigError(f"{where}: options.dtype {dtype!r} is not one of {list(DTYPES)}")
        channels_last = opts.get("channels_last", False)
        if not isinstance(channels_last, bool):
            raise ConfigError(f"{where}: options.channels_last must be true or false")
        compile_opt = opts.get("compile", False)
        if not isinstance(compile_opt, bool | str):
            raise ConfigError(f"{where}: options.compile must be true, false or a backend name")
        backend = "inductor" if compile_opt is True else (compile_opt or "")
        return cls(str(dtype), channels_last, backend)


@dataclass(frozen=True)
class HandlerContext:
    """What carpool hands a handler: where to run, and how (the model's torch options)."""

    device: torch.device
    torch_options: TorchOptions

    @classmethod
    def of(cls, spec: ModelSpec, device: str) -> HandlerContext:
        return cls(torch.device(device), TorchOptions.of(spec))

    def prepare(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` in eval mode on the device, channels-last and compiled as asked.

        Call it once in ``load()`` on the module ``forward`` runs.
        """
        try:
            module = module.eval()
        except NotImplementedError:
            pass  # a torch.export program: traced in eval mode, it refuses eval()
        module = module.to(self.device)
        if self.torch_options.channels_last:
            module = module.to(memory_format=torch.channels_last)
        if self.torch_options.compile_backend:
            compiled: torch.nn.Module = torch.compile(  # type: ignore[assignment]
                module, backend=self.torch_options.compile_backend)
            return compiled
        return module

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Entered around each forward pass: autocast in the model's ``dtype``."""
        dtype = DTYPES[self.torch_options.dtype]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def inputs(self, batch: Any) -> Any:
        """The batch with each 4-D floating or uint8 tensor channels-last, if asked."""
        if not self.torch_options.channels_last:
            return batch

        def nhwc(_: str, t: torch.Tensor) -> torch.Tensor:
            if t.dim() == 4:
                return t.contiguous(memory_format=torch.channels_last)
            return t

        return map_tensors(batch, nhwc)
