"""OpenAI's embeddings request and answer, over carpool's text models.

A request ``{"model", "input": str | [str, ...], "encoding_format"?, "dimensions"?,
"user"?}`` becomes one carpool text job per string (``{"text": ...}``); the answer
is ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage"}``. ``encoding_format="base64"`` (what the openai SDK asks for
by default) is the vector as little-endian float32, base64. Used by
``POST /v1/embeddings`` and by batch lines whose ``url`` is ``/v1/embeddings``.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from carpool.admission.tiers import known_tier
from carpool.core.catalogue import Catalogue, ModelSpec
from carpool.core.errors import InvalidInput
from carpool.core.input_limits import InputLimits
from carpool.core.kinds import kind_of
from carpool.intake import inputs

#: Strings in one embeddings request (OpenAI's own bound).
MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")
_KEYS = frozenset({"model", "input", "encoding_format", "dimensions", "user",
                   "service_tier"})


@dataclass(frozen=True)
class EmbedRequest:
    spec: ModelSpec
    prepared: tuple[inputs.Prepared, ...]
    encoding_format: str
    service_tier: str = ""  # asked for (carpool/admission/tiers.py); "" none


def embed_request(doc: Any, catalogue: Catalogue, limits: InputLimits,
                  max_inputs: int = MAX_INPUTS) -> EmbedRequest:
    """Validate an embeddings body; InvalidInput (400) names what is wrong."""
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object {'model', 'input'}")
    unknown = set(doc) - _KEYS
    if unknown:
        raise InvalidInput(f"unknown field(s) {sorted(unknown)[:5]}; allowed: {sorted(_KEYS)}")
    if not isinstance(doc.get("model"), str):
        raise InvalidInput("'model' must be a string naming a text model (GET /models)")
    spec = catalogue.get(doc["model"])
    if kind_of(spec).input_form != "text":
        raise InvalidInput(f"model {spec.name!r} is not a text embedder (kind {spec.kind!r})")
    raw = doc.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidInput("'input' must be a non-empty string or a non-empty list of "
                           "strings (token arrays are not taken)")
    if len(texts) > max_inputs:
        raise InvalidInput(f"'input' holds {len(texts)} strings; at most {max_inputs}")
    encoding = doc.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise InvalidInput(f"encoding_format must be one of {list(ENCODINGS)}")
    dimensions = doc.get("dimensions")
    # A bool is an int to Python: ``true`` would ask for 1 dimension.
    if dimensions is not None and (isinstance(dimensions, bool)
                                   or not isinstance(dimensions, int) or dimensions < 1):
        raise InvalidInput(f"'dimensions' must be a positive integer, not "
                           f"{json.dumps(dimensions)[:40]}")
    prepared = []
    for i, text in enumerate(texts):
        try:
            prepared.append(inputs.prepare(spec, {"text": text}, limits))
        except InvalidInput as exc:
            raise type(exc)(f"input[{i}]: {exc}") from None
    tier = doc.get("service_tier")
    return EmbedRequest(spec, tuple(prepared), str(encoding),
                        "" if tier is None else known_tier(tier))


def check_dimensions(doc: dict[str, Any], results: Sequence[Any]) -> None:
    """A ``dimensions`` that the model's vectors do not have is refused (no truncation)."""
    want = doc.get("dimensions")
    if want is not None and results and len(results[0]["embedding"]) != want:
        raise InvalidInput(f"dimensions={want}: this model's vectors have "
                           f"{len(results[0]['embedding'])} dimensions")


def embeddings_answer(spec: ModelSpec, results: Sequence[Any], encoding_format: str
                      ) -> dict[str, Any]:
    """OpenAI's answer from carpool text results (``{"embedding", "tokens", ...}``); its
    ``model`` is the name addressed (``m@2`` for a declared version), and carpool adds
    ``model_version``."""
    data = [{"object": "embedding", "index": i,
             "embedding": _encoded(r["embedding"], encoding_format)}
            for i, r in enumerate(results)]
    tokens = sum(int(r.get("tokens", 0)) for r in results)
    return {"object": "list", "data": data, "model": spec.name, "model_version": spec.version,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _encoded(vector: Sequence[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return list(vector)
