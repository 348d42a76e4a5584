"""The model kinds carpool serves, in one table that the worker and the web both read.

A kind names how the web reads one input (``input_form``: carpool/intake/inputs.py validates
and bins it, web/openapi/schemas.py publishes its schema, each with one function per form)
and where the worker's handler lives (``handler``, ``"module:function"``, imported
only when a model of that kind is served, so the web never imports torch). Adding a
kind whose inputs take one of the forms is one row here.

Each kind also declares its tensors for the Open Inference Protocol (``/v2``,
carpool/core/tensor_specs.py): the built-in kinds here, a ``kind = "python"`` model
in its own catalogue entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from carpool.core.catalogue import PYTHON_KIND, ModelSpec
from carpool.core.errors import ConfigError
from carpool.core.model_options import int_option
from carpool.core.tensor_specs import ModelTensors, TensorSpec, tensors_from

#: How the web reads an input: ``{"value", "size"}``; an image (JSON base64 or a
#: file); ``{"text"}``; or whatever a python model's own input_schema says.
INPUT_FORMS = ("sized", "image", "text", "custom")


@dataclass(frozen=True)
class Kind:
    name: str
    input_form: str  # one of INPUT_FORMS
    #: ``"module:function"``: the function takes (spec, settings) and answers the
    #: worker's ModelHandler for ``spec``, not yet loaded.
    handler: str
    #: The handler runs a torch model (and so wants the torch executor).
    torch: bool
    #: Its models' tensors (``/v2``); None: the model declares none (not on /v2).
    tensors: Callable[[ModelSpec], ModelTensors | None]


def _synthetic_tensors(spec: ModelSpec) -> ModelTensors:
    # A row of VALUE is the job's value, its length the job's size (its bin).
    return ModelTensors(
        inputs=(TensorSpec("VALUE", "FP32", (-1,), "value"),),
        outputs=(TensorSpec("ECHO", "FP32", (-1,), "echo"),
                 TensorSpec("CHECKSUM", "BYTES", (1,), "checksum")))


def _image_tensors(spec: ModelSpec) -> ModelTensors:
    # One encoded image file (JPEG, PNG, ...) per row; "_b64": sent to the job as base64.
    top_k = int_option(spec, "top_k", -1)
    return ModelTensors(
        inputs=(TensorSpec("IMAGE", "BYTES", (1,), "image_b64"),),
        outputs=(TensorSpec("SCORES", "FP32", (top_k,), "top_k[].score"),
                 TensorSpec("INDICES", "INT64", (top_k,), "top_k[].index"),
                 TensorSpec("LABELS", "BYTES", (top_k,), "top_k[].label")))


def _text_tensors(spec: ModelSpec) -> ModelTensors:
    return ModelTensors(
        inputs=(TensorSpec("TEXT", "BYTES", (1,), "text"),),  # UTF-8
        outputs=(TensorSpec("EMBEDDING", "FP32", (-1,), "embedding"),
                 TensorSpec("TOKENS", "INT64", (1,), "tokens")))


def _declared_tensors(spec: ModelSpec) -> ModelTensors | None:
    return None if spec.tensors is None else tensors_from(spec.name, spec.tensors)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("synthetic", "sized", "worker.handlers.synthetic:handler_for", torch=False,
         tensors=_synthetic_tensors),
    Kind("image", "image", "worker.handlers.image:handler_for", torch=True,
         tensors=_image_tensors),
    Kind("text", "text", "worker.handlers.text:handler_for", torch=True,
         tensors=_text_tensors),
    # A weightless text embedder (a hash of the text): the embeddings path at scale.
    Kind("hashembed", "text", "worker.handlers.hashembed:handler_for", torch=False,
         tensors=_text_tensors),
    Kind(PYTHON_KIND, "custom", "worker.handlers.python:handler_for", torch=True,
         tensors=_declared_tensors),
)}


def kind_of(spec: ModelSpec) -> Kind:
    """``spec``'s kind; ConfigError for a kind carpool has no handler for."""
    kind = KINDS.get(spec.kind)
    if kind is None:
        raise ConfigError(f"model {spec.name!r}: no handler for kind {spec.kind!r} "
                          f"(kinds: {sorted(KINDS)})")
    return kind
