"""Tensor declarations: each model's input and output tensors as the Open Inference
Protocol names them (``name``, ``datatype``, ``shape``), and which key of a carpool
job's input or result each one is.

A declaration is plain data, read by the web without torch: the built-in kinds
declare theirs in ``carpool.core.kinds``; a ``kind = "python"`` model declares its
own in its catalogue entry (``[models.<m>.tensors]``, docs/own-model.md), beside its
input schema, for the same reason: the web never imports the handler.

A shape is one row's (one job's) shape, without the batch dimension: every carpool
model batches, so a request's tensors carry a leading batch dimension of one row
per job. ``-1`` is a dimension of any size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from carpool.core.errors import ConfigError

#: The datatypes carpool reads and writes (the protocol's names). BYTES elements
#: are byte strings (UTF-8 text, or a file such as a JPEG).
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
             "INT64", "FP16", "FP32", "FP64", "BYTES")
#: Dimensions of one row at most: more is never a model input here.
MAX_ROW_DIMS = 8
_TENSOR_KEYS = frozenset({"name", "datatype", "shape", "field"})


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: its protocol name, datatype and row shape, and its job key."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # one row's; -1: any size
    #: The key of the job's input (an input tensor) or result (an output) it is.
    field: str

    def to_json(self) -> dict[str, Any]:
        """As the protocol's model metadata shows it: the batch dimension first."""
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}


@dataclass(frozen=True)
class ModelTensors:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)


def tensors_from(model: str, raw: Mapping[str, Any]) -> ModelTensors:
    """A catalogue entry's ``tensors`` table: ``inputs`` and ``outputs``, arrays of
    ``{name, datatype, shape, field}``; ConfigError naming what is wrong."""
    unknown = set(raw) - {"inputs", "outputs"}
    if unknown:
        raise ConfigError(f"model {model!r}: tensors has unknown keys {sorted(unknown)}; "
                          "it takes 'inputs' and 'outputs'")
    inputs = _list(model, "inputs", raw.get("inputs"))
    outputs = _list(model, "outputs", raw.get("outputs"))
    for which, group in (("inputs", inputs), ("outputs", outputs)):
        names = [t.name for t in group]
        if len(set(names)) != len(names):
            raise ConfigError(f"model {model!r}: tensors.{which} repeats a name: {names}")
    return ModelTensors(inputs, outputs)


def _list(model: str, which: str, raw: Any) -> tuple[TensorSpec, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise ConfigError(f"model {model!r}: tensors.{which} must be a non-empty array of "
                          "{name, datatype, shape, field} tables")
    return tuple(_tensor(model, f"tensors.{which}[{i}]", item) for i, item in enumerate(raw))


def _tensor(model: str, where: str, raw: Any) -> TensorSpec:
    if not isinstance(raw, Mapping) or set(raw) != _TENSOR_KEYS:
        got = sorted(raw) if isinstance(raw, Mapping) else type(raw).__name__
        raise ConfigError(f"model {model!r}: {where} needs exactly the keys "
                          f"{sorted(_TENSOR_KEYS)}, got {got}")
    name, datatype, shape, field = raw["name"], raw["datatype"], raw["shape"], raw["field"]
    if not isinstance(name, str) or not name or not isinstance(field, str) or not field:
        raise ConfigError(f"model {model!r}: {where}: name and field must be non-empty strings")
    if datatype not in DATATYPES:
        raise ConfigError(f"model {model!r}: {where}: datatype {datatype!r} is not one of "
                          f"{list(DATATYPES)}")
    if (not isinstance(shape, Sequence) or len(shape) > MAX_ROW_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and (d > 0 or d == -1)
                       for d in shape)):
        raise ConfigError(f"model {model!r}: {where}: shape must be a list of at most "
                          f"{MAX_ROW_DIMS} sizes (> 0, or -1 for any), one row's, without "
                          "the batch dimension")
    return TensorSpec(name, datatype, tuple(shape), field)
