"""web/open_inference/tensors.py and carpool/core/tensor_specs.py: tensors in and out,
declarations."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from carpool.core.errors import ConfigError, InvalidInput
from carpool.core.tensor_specs import tensors_from
from web.open_inference.tensors import ModelOutputMismatch, encode_output, parse_request


def binary(header: dict[str, Any], data: bytes) -> tuple[bytes, str]:
    head = json.dumps(header).encode()
    return head + data, str(len(head))


def one(datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": datatype, "shape": shape,
                        "parameters": {"binary_data_size": size}}]}


def test_binary_fp32_int64_and_uint8_decode_little_endian() -> None:
    for datatype, code, values in (("FP32", "f", [0.5, -2.0]), ("INT64", "q", [-3, 2**40]),
                                   ("UINT8", "B", [0, 255])):
        raw = struct.pack(f"<2{code}", *values)
        body, n = binary(one(datatype, [1, 2], len(raw)), raw)
        (tensor,) = parse_request(body, n).inputs
        assert tensor.data == values and tensor.shape == (1, 2)


def test_binary_bytes_elements_are_length_prefixed() -> None:
    raw = b"".join(struct.pack("<I", len(e)) + e for e in (b"\xff\xd8jpeg", b""))
    body, n = binary(one("BYTES", [2, 1], len(raw)), raw)
    assert parse_request(body, n).inputs[0].data == [b"\xff\xd8jpeg", b""]


def test_json_data_may_be_nested_or_flat() -> None:
    for data in ([[1, 2], [3, 4]], [1, 2, 3, 4]):
        doc = {"inputs": [{"name": "X", "datatype": "INT64", "shape": [2, 2], "data": data}]}
        assert parse_request(json.dumps(doc).encode(), None).inputs[0].data == [1, 2, 3, 4]


@pytest.mark.parametrize("datatype, value", [("UINT8", -1), ("INT8", 128), ("INT64", 1.5),
                                             ("FP32", "1"), ("BOOL", 1), ("BYTES", 3)])
def test_a_json_element_of_the_wrong_type_is_refused(datatype: str, value: Any) -> None:
    doc = {"inputs": [{"name": "X", "datatype": datatype, "shape": [1, 1], "data": [value]}]}
    with pytest.raises(InvalidInput, match=datatype if datatype != "BYTES" else "string"):
        parse_request(json.dumps(doc).encode(), None)


def test_binary_outputs_round_trip_and_say_their_size() -> None:
    entry, raw = encode_output("Y", "FP32", [1, 2], [0.5, 1.0], binary=True)
    assert entry["parameters"] == {"binary_data_size": 8} and "data" not in entry
    assert struct.unpack("<2f", raw) == (0.5, 1.0)
    entry, raw = encode_output("L", "BYTES", [1, 2], ["cat", "owl"], binary=True)
    assert raw == b"\x03\x00\x00\x00cat\x03\x00\x00\x00owl"
    entry, raw = encode_output("L", "BYTES", [1, 1], ["cat"], binary=False)
    assert entry["data"] == ["cat"] and raw == b""


@pytest.mark.parametrize(("datatype", "value"), [
    ("INT32", 2**40), ("UINT8", -1), ("FP32", 1e39), ("FP16", 70000.0)])
def test_a_binary_output_its_datatype_cannot_hold_is_a_model_output_mismatch(
        datatype: str, value: Any) -> None:
    with pytest.raises(ModelOutputMismatch, match=f"does not fit {datatype}"):
        encode_output("Y", datatype, [1, 1], [value], binary=True)


@pytest.mark.parametrize("raw, message", [
    ({"inputs": []}, "non-empty"),
    ({"inputs": [{"name": "X", "datatype": "FP8", "shape": [1], "field": "x"}],
      "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1], "field": "y"}]}, "FP8"),
    ({"inputs": [{"name": "X", "datatype": "FP32", "shape": [0], "field": "x"}],
      "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1], "field": "y"}]}, "shape"),
    ({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1]}],
      "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1], "field": "y"}]}, "keys"),
    ({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "field": "x"}] * 2,
      "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1], "field": "y"}]}, "repeats"),
], ids=["no-inputs", "datatype", "zero-dim", "no-field", "repeated-name"])
def test_a_bad_tensors_table_fails_at_start_naming_the_model(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=f"model 'm'.*{message}"):
        tensors_from("m", raw)
