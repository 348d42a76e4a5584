"""A model as the Open Inference Protocol sees it: metadata, configuration, and the
mapping between a request's tensors and carpool jobs (docs/v2.md).

Every carpool model batches, so its tensors carry a leading batch dimension: row i
of every input tensor is job i's input, and row i of every output tensor is read
from job i's result. A row whose declared shape is ``[1]`` is one value in the job
(``{"text": "..."}``), any other a nested list of that shape. A BYTES value is UTF-8
text in the job, or base64 where the job key ends in ``_b64`` (an image file).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from carpool.admission.urgency import MAX_PRIORITY, MIN_PRIORITY
from carpool.core.catalogue import ModelSpec
from carpool.core.errors import InvalidInput, UnknownModel
from carpool.core.kinds import kind_of
from carpool.core.tensor_specs import ModelTensors, TensorSpec
from carpool.core.webhooks import EVENTS, webhook_option
from web.open_inference.tensors import InferRequest, ModelOutputMismatch, Tensor

PLATFORM = "carpool"
#: Triton's priority levels: 1 is the highest, and level 1 + i is carpool's 9 - i.
PRIORITY_LEVELS = MAX_PRIORITY - MIN_PRIORITY + 1
#: Triton's config names its datatypes thus, BYTES as STRING.
_CONFIG_TYPES = {"BYTES": "TYPE_STRING"}


@dataclass(frozen=True)
class JobOptions:
    """What a request's parameters ask of its jobs, in carpool's terms."""

    priority: int
    deadline_ms: int  # 0: the model's default
    #: Each row's webhook, as the record keeps it (carpool/core/webhooks.py); "" none.
    hook: str = ""


#: Each catalogue model's tensors, worked out once: a process serves one catalogue,
#: whose specs live as long as it does (keyed by identity: a spec is not hashable).
_TENSORS: dict[int, tuple[ModelSpec, ModelTensors | None]] = {}


def tensors_of(spec: ModelSpec) -> ModelTensors:
    """``spec``'s tensors; UnknownModel (404) for a model that declares none."""
    known = _TENSORS.get(id(spec))
    if known is None or known[0] is not spec:
        known = _TENSORS[id(spec)] = (spec, kind_of(spec).tensors(spec))
    tensors = known[1]
    if tensors is None:
        raise UnknownModel(f"model {spec.name!r} declares no tensors, so /v2 does not serve "
                           "it: add [models.<m>.tensors] to its catalogue entry "
                           "(docs/own-model.md), or use POST /submit")
    return tensors


def max_batch_size(spec: ModelSpec) -> int:
    """Rows one request may carry: the largest batch any of its bins forms."""
    return max(b.max_batch for b in spec.bins)


def metadata(spec: ModelSpec, versions: Sequence[str]) -> dict[str, Any]:
    """The model metadata of ``spec``, which serves one of the model's ``versions``."""
    tensors = tensors_of(spec)
    return {"name": spec.base_name, "versions": list(versions), "platform": PLATFORM,
            "inputs": [t.to_json() for t in tensors.inputs],
            "outputs": [t.to_json() for t in tensors.outputs]}


def config(spec: ModelSpec, instances: int) -> dict[str, Any]:
    """The model-configuration extension: Triton's config, from the catalogue and bins."""
    tensors = tensors_of(spec)

    def entry(t: TensorSpec) -> dict[str, Any]:
        return {"name": t.name, "data_type": _CONFIG_TYPES.get(t.datatype, f"TYPE_{t.datatype}"),
                "dims": list(t.shape)}

    bins = ";".join(f"{b.name}:max_size={b.max_size},max_batch={b.max_batch},"
                    f"max_wait_ms={b.max_wait_ms},max_depth={b.max_depth}" for b in spec.bins)
    return {
        "name": spec.base_name, "platform": PLATFORM, "backend": PLATFORM, "version_policy":
        {"latest": {"num_versions": 1}}, "max_batch_size": max_batch_size(spec),
        "input": [entry(t) for t in tensors.inputs],
        "output": [entry(t) for t in tensors.outputs],
        "dynamic_batching": {
            "preferred_batch_size": sorted({b.max_batch for b in spec.bins}),
            "max_queue_delay_microseconds": max(b.max_wait_ms for b in spec.bins) * 1000,
            "priority_levels": PRIORITY_LEVELS,
            "default_priority_level": PRIORITY_LEVELS,  # carpool's 0
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": spec.default_deadline_ms * 1000,
                "allow_timeout_override": True,
                "max_queue_size": sum(b.max_depth for b in spec.bins)}},
        "model_transaction_policy": {"decoupled": False},  # one response per request
        "instance_group": [{"name": spec.name, "kind": "KIND_MODEL", "count": instances}],
        "parameters": {"carpool_bins": {"string_value": bins},
                       "carpool_measure": {"string_value": spec.measure}},
    }


def statistics(spec: ModelSpec, ended: int) -> dict[str, Any]:
    """One model's entry of the statistics extension: the jobs its bins drained; no
    per-phase times (0 ns), which carpool keeps in its own metrics instead."""
    def zero(count: int = 0) -> dict[str, int]:
        return {"count": count, "ns": 0}

    return {"name": spec.base_name, "version": spec.version, "last_inference": 0,
            "inference_count": ended, "execution_count": 0,
            "inference_stats": {"success": zero(ended), "fail": zero(), "queue": zero(),
                                "compute_input": zero(), "compute_infer": zero(),
                                "compute_output": zero(), "cache_hit": zero(),
                                "cache_miss": zero()},
            "batch_stats": []}


def job_options(spec: ModelSpec, parameters: Mapping[str, Any],
                allow_private: bool = False) -> JobOptions:
    """Triton's ``priority`` (1 = highest, 0 = default) and ``timeout`` (µs), and
    carpool's ``webhook`` and ``webhook_events``."""
    for unsupported in ("sequence_id", "sequence_start", "sequence_end"):
        if parameters.get(unsupported) not in (None, 0, "", False):
            raise InvalidInput(f"parameters.{unsupported}: carpool runs no sequence batcher; "
                               "each request's rows are independent jobs")
    raw_priority = parameters.get("priority", 0)
    if (isinstance(raw_priority, bool) or not isinstance(raw_priority, int)
            or not 0 <= raw_priority <= PRIORITY_LEVELS):
        raise InvalidInput(f"parameters.priority must be an integer 0..{PRIORITY_LEVELS} "
                           f"(1 is the highest, 0 the default), got {str(raw_priority)[:20]}")
    priority = MIN_PRIORITY if raw_priority == 0 else MAX_PRIORITY - (raw_priority - 1)
    raw_timeout = parameters.get("timeout", 0)
    if (isinstance(raw_timeout, bool) or not isinstance(raw_timeout, int)
            or raw_timeout < 0):
        raise InvalidInput("parameters.timeout must be microseconds, an integer >= 0 "
                           f"(0: the model's default deadline), got {str(raw_timeout)[:20]}")
    deadline_ms = math.ceil(raw_timeout / 1000)
    if deadline_ms > spec.max_deadline_ms:
        raise InvalidInput(f"parameters.timeout {raw_timeout} µs is over the model's "
                           f"max_deadline_ms ({spec.max_deadline_ms} ms)")
    return JobOptions(priority, deadline_ms, webhook_of(parameters, allow_private))


def webhook_of(parameters: Mapping[str, Any], allow_private: bool) -> str:
    """The rows' ``hook`` field from ``parameters.webhook`` (a URL) and
    ``parameters.webhook_events``: the protocol's parameter values are strings, numbers
    and booleans, so the events are one comma-separated string ("done,failed"); a JSON
    list, as ``POST /submit`` takes, is accepted too. Checked as /submit checks them."""
    events = parameters.get("webhook_events")
    if isinstance(events, str):
        events = [e.strip() for e in events.split(",")]
    elif events is not None and not isinstance(events, list):
        raise InvalidInput("parameters.webhook_events must be a string of comma-separated "
                           f"events (\"done,failed\"), any of {list(EVENTS)}")
    try:
        return webhook_option({"webhook": parameters.get("webhook"),
                               "webhook_events": events}, allow_private)
    except InvalidInput as exc:
        exc.args = (f"parameters: {exc}",)
        raise


def job_inputs(spec: ModelSpec, tensors: ModelTensors, request: InferRequest) -> list[Any]:
    """One job input per row of the request's tensors, in order."""
    given = {t.name: t for t in request.inputs}
    declared = {t.name for t in tensors.inputs}
    unknown, missing = set(given) - declared, declared - set(given)
    if unknown or missing:
        raise InvalidInput(f"model {spec.name!r} takes the inputs {sorted(declared)}; "
                           f"unknown: {sorted(unknown)[:5]}, missing: {sorted(missing)}")
    columns = [(t, _rows(spec, t, given[t.name])) for t in tensors.inputs]
    n = len(columns[0][1])
    if any(len(rows) != n for _, rows in columns):
        raise InvalidInput("every input must have the same batch dimension (shape[0]): "
                           + ", ".join(f"{t.name} {len(rows)}" for t, rows in columns))
    jobs = []
    for i in range(n):
        job = {t.field: rows[i] for t, rows in columns}
        if kind_of(spec).input_form == "sized":  # the synthetic model's size is its row's
            value = job.get("value")
            job["size"] = len(value) if isinstance(value, list) else 1
        jobs.append(job)
    return jobs


def _rows(spec: ModelSpec, declared: TensorSpec, tensor: Tensor) -> list[Any]:
    where = f"input {tensor.name!r}"
    if tensor.datatype != declared.datatype:
        raise InvalidInput(f"{where} is {declared.datatype}, not {tensor.datatype}")
    row_shape = tensor.shape[1:]
    if len(row_shape) != len(declared.shape) or any(
            d not in (-1, got) for d, got in zip(declared.shape, row_shape, strict=True)):
        raise InvalidInput(f"{where}: shape {list(tensor.shape)} does not match "
                           f"{[-1, *declared.shape]} (the batch dimension first)")
    n, limit = tensor.shape[0], max_batch_size(spec)
    if not 1 <= n <= limit:
        raise InvalidInput(f"{where}: {n} rows; model {spec.name!r} takes 1..{limit} per "
                           "request (max_batch_size)")
    size = math.prod(row_shape)
    convert = _bytes_value(declared) if declared.datatype == "BYTES" else None
    rows = []
    for i in range(n):
        flat = tensor.data[i * size:(i + 1) * size]
        if convert is not None:
            flat = [convert(v, where, i) for v in flat]
        rows.append(flat[0] if declared.shape == (1,) else _nest(flat, row_shape))
    return rows


def _bytes_value(declared: TensorSpec) -> Any:
    if declared.field.endswith("_b64"):
        return lambda v, where, i: base64.b64encode(v).decode("ascii")

    def text(v: bytes, where: str, i: int) -> str:
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{where} row {i} is not UTF-8 text") from None

    return text


def _nest(flat: list[Any], shape: Sequence[int]) -> list[Any]:
    if len(shape) <= 1:
        return flat
    step = math.prod(shape[1:])
    return [_nest(flat[j * step:(j + 1) * step], shape[1:]) for j in range(shape[0])]


def requested_outputs(tensors: ModelTensors, request: InferRequest
                      ) -> list[tuple[TensorSpec, bool]]:
    """The outputs to answer, each with whether it goes in binary."""
    if request.outputs is None:
        binary = bool(request.parameters.get("binary_data_output", False))
        return [(t, binary) for t in tensors.outputs]
    out = []
    for asked in request.outputs:
        spec = tensors.output(asked.name)
        if spec is None:
            raise InvalidInput(f"unknown output {asked.name[:40]!r}; this model's outputs: "
                               f"{[t.name for t in tensors.outputs]}")
        out.append((spec, asked.binary))
    return out


def output_data(declared: TensorSpec, results: Sequence[Any]
                ) -> tuple[list[int], list[Any]]:
    """The output tensor's shape (batch first) and flat data, from each row's result."""
    flat: list[Any] = []
    row_shape: tuple[int, ...] | None = None
    for i, result in enumerate(results):
        value = _pluck(result, declared.field)
        shape, values = _flatten(value)
        if declared.shape == (1,) and shape == ():
            shape = (1,)
        if row_shape is not None and shape != row_shape:
            raise ModelOutputMismatch(f"output {declared.name!r}: row {i} has shape "
                                      f"{list(shape)}, row 0 {list(row_shape)}")
        row_shape = shape
        flat.extend(values)
    return [len(results), *(row_shape or ())], _typed_all(declared, flat)


def _pluck(result: Any, field: str) -> Any:
    """``field`` of a job's result; ``a[].b``: key b of each item of the list at a."""
    head, _, tail = field.partition("[].")
    try:
        value = result[head]
        return [item[tail] for item in value] if tail else value
    except (KeyError, TypeError, IndexError):
        raise ModelOutputMismatch(f"a result has no {field!r} (the output's job key): "
                                  f"{json.dumps(result)[:120]}") from None


def _flatten(value: Any) -> tuple[tuple[int, ...], list[Any]]:
    if not isinstance(value, list):
        return (), [value]
    if not any(isinstance(v, list) for v in value):  # a vector: the common case
        return (len(value),), value
    parts = [_flatten(v) for v in value]
    shapes = {s for s, _ in parts}
    if len(shapes) > 1:
        raise ModelOutputMismatch("a result's array is ragged: it is no tensor")
    inner = shapes.pop() if shapes else ()
    return (len(value), *inner), [v for _, vs in parts for v in vs]


def _typed_all(declared: TensorSpec, values: list[Any]) -> list[Any]:
    """``values`` as the output's datatype: one pass for floats and integers, else
    value by value (naming the first that does not fit)."""
    kinds = {type(v) for v in values}
    if declared.datatype.startswith(("INT", "UINT")) and kinds <= {int}:
        return values
    if declared.datatype.startswith("FP") and kinds <= {int, float}:
        return values if kinds <= {float} else [float(v) for v in values]
    return [_typed(declared, v) for v in values]


def _typed(declared: TensorSpec, value: Any) -> Any:
    if declared.datatype == "BYTES":
        return value if isinstance(value, str) else json.dumps(value)
    if declared.datatype == "BOOL":
        if not isinstance(value, bool):
            raise ModelOutputMismatch(f"output {declared.name!r}: {value!r} is no BOOL")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelOutputMismatch(f"output {declared.name!r}: {str(value)[:30]} is no number")
    if declared.datatype.startswith(("INT", "UINT")):
        if not isinstance(value, int):
            raise ModelOutputMismatch(f"output {declared.name!r}: {value} is no integer")
        return value
    return float(value)

