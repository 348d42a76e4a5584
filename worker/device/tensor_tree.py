"""Walking the tensors inside a batch (a tensor, or dicts, lists and tuples of them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def map_tensors(batch: Any, fn: Callable[[str, torch.Tensor], torch.Tensor],
                path: str = "") -> Any:
    """``batch`` with ``fn(path, tensor)`` applied to every tensor inside it."""
    if isinstance(batch, torch.Tensor):
        return fn(path, batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn, f"{path}.{k}") for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(map_tensors(v, fn, f"{path}[{i}]") for i, v in enumerate(batch))
    return batch
