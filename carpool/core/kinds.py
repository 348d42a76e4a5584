"""The model kinds carpool serves, in one table that the worker and the web both read.

A kind names how the web reads one input (``input_form``: web/inputs.py validates
and bins it, web/schemas.py publishes its schema, each with one function per form)
and where the worker's handler lives (``handler``, ``"module:function"``, imported
only when a model of that kind is served, so the web never imports torch). Adding a
kind whose inputs take one of the forms is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from carpool.core.catalogue import PYTHON_KIND, ModelSpec
from carpool.core.errors import ConfigError

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


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("synthetic", "sized", "worker.handlers.synthetic:handler_for", torch=False),
    Kind("image", "image", "worker.handlers.image:handler_for", torch=True),
    Kind("text", "text", "worker.handlers.text:handler_for", torch=True),
    # A weightless text embedder (a hash of the text): the embeddings path at scale.
    Kind("hashembed", "text", "worker.handlers.hashembed:handler_for", torch=False),
    Kind(PYTHON_KIND, "custom", "worker.handlers.python:handler_for", torch=True),
)}


def kind_of(spec: ModelSpec) -> Kind:
    """``spec``'s kind; ConfigError for a kind carpool has no handler for."""
    kind = KINDS.get(spec.kind)
    if kind is None:
        raise ConfigError(f"model {spec.name!r}: no handler for kind {spec.kind!r} "
                          f"(kinds: {sorted(KINDS)})")
    return kind
