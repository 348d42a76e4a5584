"""Tensors of the Open Inference Protocol: JSON ``data`` and the binary tensor extension.

An infer request body is JSON, or, with the ``Inference-Header-Content-Length: N``
header, N bytes of JSON followed by each input's raw bytes in order (an input names
its share with ``parameters.binary_data_size``). Sizes are checked against the body
(already read within its limit, web/common/bodies.py) before a byte is interpreted: a
header longer than the body, or binary sizes that do not add up to the rest, is a
400. Numbers are little-endian; a BYTES element is a 4-byte little-endian length
and that many bytes, in binary as in the protocol.

Here tensors are flat lists of Python values with a shape; web/open_inference/routes.py turns rows
into jobs and results back into tensors.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from carpool.core.errors import CarpoolError, InvalidInput
from carpool.core.strict_json import parse_json
from carpool.core.tensor_specs import DATATYPES

#: ``struct`` codes of the fixed-size datatypes (BYTES has none: length-prefixed).
STRUCT_CODES = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q",
                "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e",
                "FP32": "f", "FP64": "d"}
_INT_RANGES = {"UINT8": (0, 2**8 - 1), "UINT16": (0, 2**16 - 1), "UINT32": (0, 2**32 - 1),
               "UINT64": (0, 2**64 - 1), "INT8": (-(2**7), 2**7 - 1),
               "INT16": (-(2**15), 2**15 - 1), "INT32": (-(2**31), 2**31 - 1),
               "INT64": (-(2**63), 2**63 - 1)}
#: The largest finite value of each float datatype: a larger one would be infinity.
_FLOAT_MAX = {"FP16": 65504.0, "FP32": 3.4028234663852886e38, "FP64": 1.7976931348623157e308}
#: Dimensions of a request tensor at most (the batch dimension included).
MAX_DIMS = 9
#: Elements of one request tensor at most: far above any model's rows here, and a
#: bound on the Python objects built from a body.
MAX_ELEMENTS = 1 << 22
#: The BYTES length prefix.
_LENGTH = struct.Struct("<I")
#: ``model_name`` and ``model_version`` are KServe's client's (the path names the model).
REQUEST_KEYS = frozenset({"id", "inputs", "outputs", "parameters", "model_name",
                          "model_version"})
_INPUT_KEYS = frozenset({"name", "datatype", "shape", "data", "parameters"})
_OUTPUT_KEYS = frozenset({"name", "parameters"})


class ModelOutputMismatch(CarpoolError):
    """Raised when a job's result does not fit the output tensor its model declares."""


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: list[Any]  # flat, row-major: numbers, bools, or bytes (BYTES)


@dataclass(frozen=True)
class Requested:
    """One output the client asked for, and whether it wants it in binary."""

    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    parameters: dict[str, Any]
    inputs: tuple[Tensor, ...]
    #: None: every output, each in binary when ``parameters.binary_data_output``.
    outputs: tuple[Requested, ...] | None
    #: What the body says of the model, if anything (the path decides; they must agree).
    model_name: Any = None
    model_version: Any = None


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """The infer request in ``body``; InvalidInput (400) naming what is wrong."""
    json_part, binary = _split(body, header_length)
    doc = parse_json(json_part)
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise InvalidInput("an infer request is a JSON object with 'inputs' (an array of "
                           "{name, datatype, shape, data})")
    unknown = set(doc) - REQUEST_KEYS
    if unknown:
        raise InvalidInput(f"unknown keys {sorted(unknown)[:5]} in the infer request; "
                           f"allowed: {sorted(REQUEST_KEYS)}")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    parameters = _parameters(doc.get("parameters"), "parameters")
    raw_inputs = doc["inputs"]
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty array")
    inputs, offset = [], 0
    for i, raw in enumerate(raw_inputs):
        tensor, offset = _input(raw, i, binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidInput(f"the binary section is {len(binary)} bytes but the inputs' "
                           f"binary_data_size add up to {offset}")
    names = [t.name for t in inputs]
    if len(set(names)) != len(names):
        raise InvalidInput(f"an input is named twice: {names[:10]}")
    return InferRequest(request_id, parameters, tuple(inputs),
                        _outputs(doc.get("outputs"), parameters), doc.get("model_name"),
                        doc.get("model_version"))


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    if not (header_length.isascii() and header_length.isdigit() and len(header_length) <= 12):
        raise InvalidInput("Inference-Header-Content-Length must be a byte count, got "
                           f"{header_length[:40]!r}")
    n = int(header_length)
    if not 0 < n <= len(body):
        raise InvalidInput(f"Inference-Header-Content-Length is {n} but the body is "
                           f"{len(body)} bytes: the JSON header must lie within the body")
    return body[:n], body[n:]


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    return raw


def _input(raw: Any, i: int, binary: bytes, offset: int) -> tuple[Tensor, int]:
    where = f"inputs[{i}]"
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where} must be an object {{name, datatype, shape, data}}")
    unknown = set(raw) - _INPUT_KEYS
    missing = {"name", "datatype", "shape"} - set(raw)
    if unknown or missing:
        raise InvalidInput(f"{where}: missing keys {sorted(missing)}, unknown keys "
                           f"{sorted(unknown)[:5]}")
    name, datatype = raw["name"], raw["datatype"]
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}.name must be a non-empty string")
    where = f"input {name[:40]!r}"
    if datatype not in DATATYPES:
        raise InvalidInput(f"{where}: datatype {str(datatype)[:20]!r} is not one of "
                           f"{list(DATATYPES)}")
    shape = _shape(raw["shape"], where)
    count = math.prod(shape)
    parameters = _parameters(raw.get("parameters"), f"{where}.parameters")
    size = parameters.get("binary_data_size")
    if size is not None:
        if "data" in raw:
            raise InvalidInput(f"{where} has both 'data' and binary_data_size: send one")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidInput(f"{where}: binary_data_size must be a byte count")
        if offset + size > len(binary):
            raise InvalidInput(f"{where}: binary_data_size {size} runs past the end of the "
                               f"binary section ({len(binary)} bytes, {offset} used before it)")
        data = _from_binary(binary[offset:offset + size], datatype, count, where)
        return Tensor(name, datatype, shape, data), offset + size
    if "data" not in raw:
        raise InvalidInput(f"{where} has no 'data' (nor parameters.binary_data_size)")
    data = _flat(raw["data"], where)
    if len(data) != count:
        raise InvalidInput(f"{where}: shape {list(shape)} holds {count} elements, "
                           f"data has {len(data)}")
    return Tensor(name, datatype, shape, _elements(data, datatype, where)), offset


def _shape(raw: Any, where: str) -> tuple[int, ...]:
    if (not isinstance(raw, list) or not 1 <= len(raw) <= MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                       for d in raw)):
        raise InvalidInput(f"{where}: shape must be a list of 1..{MAX_DIMS} sizes >= 0, got "
                           f"{str(raw)[:60]}")
    if math.prod(raw) > MAX_ELEMENTS:
        raise InvalidInput(f"{where}: shape {raw} is over {MAX_ELEMENTS} elements")
    return tuple(raw)


def _flat(raw: Any, where: str) -> list[Any]:
    """``data`` flattened: the protocol allows a flat or a nested array."""
    if not isinstance(raw, list):
        raise InvalidInput(f"{where}: data must be an array")
    out: list[Any] = []
    _walk(raw, 0, where, out)
    return out


def _walk(items: list[Any], depth: int, where: str, out: list[Any]) -> None:
    if depth > MAX_DIMS:
        raise InvalidInput(f"{where}: data is nested deeper than {MAX_DIMS}")
    for item in items:
        if isinstance(item, list):
            _walk(item, depth + 1, where, out)
        else:
            out.append(item)
        if len(out) > MAX_ELEMENTS:
            raise InvalidInput(f"{where}: data is over {MAX_ELEMENTS} elements")


def _elements(data: list[Any], datatype: str, where: str) -> list[Any]:
    """JSON elements checked against ``datatype``: one pass over the common cases
    (all floats, all integers in range), else element by element for the message."""
    kinds = {type(v) for v in data}
    limits = _INT_RANGES.get(datatype)
    if limits is not None and kinds <= {int} and (
            not data or limits[0] <= min(data) and max(data) <= limits[1]):
        return data
    if datatype in _FLOAT_MAX and kinds <= {int, float}:
        return _floats(data, datatype, where)
    return [_element(v, datatype, where) for v in data]


def _floats(data: list[Any], datatype: str, where: str) -> list[float]:
    """JSON numbers as ``datatype``: a JSON integer too large for a float (309+ digits)
    or a value beyond the datatype's range would be infinity, which no model takes."""
    try:
        values = [float(v) for v in data]
    except OverflowError:
        raise InvalidInput(f"{where}: an integer is too large for {datatype}") from None
    top = _FLOAT_MAX[datatype]
    if values and not (-top <= min(values) and max(values) <= top):  # also refuses NaN
        raise InvalidInput(f"{where}: a value is outside {datatype}'s range "
                           f"(-{top:g}..{top:g}) or not finite")
    return values


def _element(value: Any, datatype: str, where: str) -> Any:
    """One JSON element, checked against ``datatype``."""
    if datatype == "BYTES":
        if not isinstance(value, str):
            raise InvalidInput(f"{where}: a BYTES element in JSON is a string, got "
                               f"{type(value).__name__}")
        return value.encode("utf-8", "surrogatepass")
    if datatype == "BOOL":
        if not isinstance(value, bool):
            raise InvalidInput(f"{where}: a BOOL element is true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{where}: a {datatype} element is a number, got "
                           f"{type(value).__name__}")
    limits = _INT_RANGES.get(datatype)
    if limits is None:
        return _floats([value], datatype, where)[0]
    if not isinstance(value, int) or not limits[0] <= value <= limits[1]:
        raise InvalidInput(f"{where}: {str(value)[:30]} is not a {datatype} "
                           f"(integers {limits[0]}..{limits[1]})")
    return value


def _from_binary(raw: bytes, datatype: str, count: int, where: str) -> list[Any]:
    if datatype == "BYTES":
        return _bytes_elements(raw, count, where)
    code = STRUCT_CODES[datatype]
    itemsize = struct.calcsize(code)
    if len(raw) != count * itemsize:
        raise InvalidInput(f"{where}: {count} {datatype} elements are {count * itemsize} "
                           f"bytes, binary_data_size says {len(raw)}")
    values = list(struct.unpack(f"<{count}{code}", raw))
    if code in "efd" and not all(math.isfinite(v) for v in values):
        raise InvalidInput(f"{where}: holds NaN or infinity, which no model input takes")
    return values


def _bytes_elements(raw: bytes, count: int, where: str) -> list[Any]:
    out: list[Any] = []
    offset = 0
    for _ in range(count):
        if offset + _LENGTH.size > len(raw):
            raise InvalidInput(f"{where}: the binary BYTES data ends inside element "
                               f"{len(out)}'s length prefix (truncated?)")
        (n,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if offset + n > len(raw):
            raise InvalidInput(f"{where}: BYTES element {len(out)} says {n} bytes, only "
                               f"{len(raw) - offset} are left (truncated?)")
        out.append(raw[offset:offset + n])
        offset += n
    if offset != len(raw):
        raise InvalidInput(f"{where}: {len(raw) - offset} bytes left over after its "
                           f"{count} BYTES elements")
    return out


def _outputs(raw: Any, parameters: dict[str, Any]) -> tuple[Requested, ...] | None:
    default = parameters.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise InvalidInput("parameters.binary_data_output must be true or false")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be an array of {name, parameters?}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "name" not in item or set(item) - _OUTPUT_KEYS:
            raise InvalidInput(f"outputs[{i}] must be an object {{name, parameters?}}")
        if not isinstance(item["name"], str):
            raise InvalidInput(f"outputs[{i}].name must be a string")
        params = _parameters(item.get("parameters"), f"outputs[{i}].parameters")
        if "classification" in params:
            raise InvalidInput("the classification extension is not supported: ask for the "
                               "model's own outputs (GET /v2/models/<m>)")
        binary = params.get("binary_data", default)
        if not isinstance(binary, bool):
            raise InvalidInput(f"outputs[{i}].parameters.binary_data must be true or false")
        out.append(Requested(item["name"], binary))
    return tuple(out)


def encode_output(name: str, datatype: str, shape: Sequence[int], data: list[Any],
                  binary: bool) -> tuple[dict[str, Any], bytes]:
    """One output tensor as the response's JSON entry, and its binary bytes (or b"")."""
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(shape)}
    if datatype == "BYTES":
        elements = [v.encode() if isinstance(v, str) else v for v in data]
        if not binary:
            entry["data"] = [e.decode("utf-8", "replace") for e in elements]
            return entry, b""
        raw = b"".join(_LENGTH.pack(len(e)) + e for e in elements)
    elif not binary:
        entry["data"] = data
        return entry, b""
    else:
        try:
            raw = struct.pack(f"<{len(data)}{STRUCT_CODES[datatype]}", *data)
        except (OverflowError, struct.error) as exc:  # a value its datatype cannot hold
            raise ModelOutputMismatch(f"output {name!r}: a value does not fit {datatype} "
                                      f"in binary ({exc}): the model returns what its "
                                      "tensors declare, or declares a wider datatype"
                                      ) from None
    entry["parameters"] = {"binary_data_size": len(raw)}
    return entry, raw
