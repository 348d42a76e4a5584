"""Submissions, parsed and validated before anything touches Redis.

A model's kind names its input form (carpool/core/kinds.py), which decides what
its input looks like; its ``measure`` decides which bin it goes to:

- ``sized`` (the synthetic model): ``{"value": <any JSON>, "size": <int >= 0>}``;
- ``image`` (image models, by pixels): an image file, or ``{"image_b64": "..."}``;
- ``text`` (text models, by tokens): ``{"text": "..."}``, measured by a pluggable
  counter (``register_measure``); by default ``carpool.core.tokens.count_tokens``,
  the same WordPiece tokenizer (no torch) the worker pads with, so a text lands in
  the bin the worker computes it in.

A ``kind = "python"`` model (a user's own handler) instead takes whatever its
``input_schema`` allows, measured by ``measure_field`` (``carpool.intake.custom``).

Everything here works on plain Python values; ``web.jobs.routes`` takes them out of
the HTTP request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from carpool.admission.tiers import known_tier
from carpool.admission.urgency import MAX_PRIORITY, MIN_PRIORITY
from carpool.core.catalogue import BinSpec, Catalogue, ModelSpec
from carpool.core.errors import (
    ConfigError,
    InputTooLarge,
    InvalidInput,
    TooManyInputs,
    UnsupportedMediaType,
)
from carpool.core.input_limits import InputLimits, check_input
from carpool.core.jobs import idempotency_digest
from carpool.core.kinds import kind_of
from carpool.core.model_options import int_option
from carpool.core.tokens import count_tokens
from carpool.core.webhooks import webhook_option
from carpool.intake import custom
from carpool.intake.images import ALLOWED_FORMATS, ImageLimits, probe

MAX_IDEMPOTENCY_KEY_CHARS = 256
#: Inputs in one /submit/batch request; each costs one admission round trip.
MAX_MANY_INPUTS = 1000
#: Default for a text model's ``options.max_chars``.
DEFAULT_MAX_CHARS = 100_000
#: C0 controls (but tab, LF, CR), DEL and C1 controls: never text a model should see,
#: and NUL breaks tokenizers written in C. (Unpaired surrogates are refused in _encode.)
_CONTROL_CHARS = frozenset(
    chr(c) for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)] if chr(c) not in "\t\n\r")
#: Digits of a form or query integer; more is never a sensible deadline or priority.
_MAX_DIGITS = 12
#: Names quoted back in an error message at most, and characters of each.
_MAX_NAMES_SHOWN, _MAX_NAME_CHARS = 5, 40

SUBMIT_KEYS = frozenset({"model", "input", "deadline_ms", "priority", "idempotency_key",
                         "webhook", "webhook_events", "service_tier"})
#: Fields of a /submit/batch body: many inputs for one model.
MANY_KEYS = frozenset({"model", "inputs", "deadline_ms", "priority", "webhook",
                       "webhook_events", "service_tier"})
#: Fields of a multipart form, or query parameters of a raw image body.
FILE_FIELDS = frozenset({"model", "deadline_ms", "priority", "idempotency_key", "webhook",
                         "webhook_events"})

#: Counts a text input in a model's measure (e.g. tokens); gets the model for its options.
TextMeasure = Callable[[ModelSpec, str], int]


def estimate_tokens(spec: ModelSpec, text: str) -> int:
    """A crude token count (about 3 bytes a token, plus begin/end), for tests."""
    return len(text.encode()) // 3 + 2


_TEXT_MEASURES: dict[str, TextMeasure] = {"tokens": count_tokens}


def register_measure(measure: str, fn: TextMeasure) -> None:
    """Count text inputs of models with this ``measure`` with ``fn`` from now on."""
    _TEXT_MEASURES[measure] = fn


@dataclass(frozen=True)
class Options:
    """How a job is queued, apart from its input."""

    deadline_ms: int = 0  # 0: none asked; the model's default applies (carpool.admission.urgency)
    priority: int = 0
    idempotency_key: str | None = None
    #: The webhook asked for, as the record keeps it (carpool/core/webhooks.py); "" none.
    hook: str = ""
    service_tier: str = ""  # a tier asked for, checked known (carpool/admission/tiers.py)

    def idempotency_digest(self, owner: str = "") -> str | None:
        """What Redis stores of the key (carpool.core.jobs.idempotency_digest)."""
        key = self.idempotency_key
        return None if key is None else idempotency_digest(key, owner)


@dataclass(frozen=True)
class Prepared:
    """An input ready to queue: its stored JSON and the bin it belongs in."""

    input_json: str
    bin: BinSpec

    def digest(self) -> str:
        return hashlib.sha256(self.input_json.encode()).hexdigest()


@dataclass(frozen=True)
class Submission:
    spec: ModelSpec
    prepared: Prepared
    options: Options


@dataclass(frozen=True)
class ManySubmission:
    """Many inputs for one model; each is prepared on its own, so each fails alone."""

    spec: ModelSpec
    inputs: list[Any]
    options: Options


def submission_from_json(doc: Any, catalogue: Catalogue, limits: InputLimits,
                         header_key: str | None, allow_private: bool = False) -> Submission:
    """A /submit JSON body: ``{"model", "input", "deadline_ms"?, "priority"?, ...}``;
    ``allow_private``: CARPOOL_WEBHOOK_ALLOW_PRIVATE."""
    doc = _object(doc, "request body", required={"model", "input"}, allowed=SUBMIT_KEYS)
    spec = catalogue.get(_model_name(doc["model"]))
    options = _options(spec, doc, _idempotency_key(doc.get("idempotency_key"), header_key),
                       allow_private)
    return Submission(spec, prepare(spec, doc["input"], limits), options)


def submission_from_file(
    fields: Mapping[str, str], data: bytes, catalogue: Catalogue, header_key: str | None,
    allow_private: bool = False,
) -> Submission:
    """An image sent as a file: multipart (``fields`` = form) or raw (``fields`` = query)."""
    unknown = {str(k) for k in fields} - FILE_FIELDS  # a nameless form part's key is None
    if unknown:
        raise InvalidInput(f"unknown fields {_names(unknown)}; allowed: {sorted(FILE_FIELDS)}")
    if "model" not in fields:
        raise InvalidInput("name the model: a 'model' form field, or ?model= for a raw body")
    spec = catalogue.get(fields["model"])
    if kind_of(spec).input_form != "image":
        raise UnsupportedMediaType(
            f"model {spec.name!r} takes a JSON body (application/json), not a file"
        )
    parsed: dict[str, Any] = {k: _digits(k, v) for k, v in fields.items()
                              if k in ("deadline_ms", "priority")}
    if "webhook" in fields:
        parsed["webhook"] = fields["webhook"]
    if "webhook_events" in fields:  # a form field: comma-separated
        parsed["webhook_events"] = fields["webhook_events"].split(",")
    key = _idempotency_key(fields.get("idempotency_key"), header_key)
    return Submission(spec, _prepare_image_bytes(spec, data),
                      _options(spec, parsed, key, allow_private))


def many_from_json(doc: Any, catalogue: Catalogue, allow_private: bool = False
                   ) -> ManySubmission:
    """A /submit/batch JSON body: ``{"model", "inputs": [...], "deadline_ms"?, "priority"?}``."""
    doc = _object(doc, "request body", required={"model", "inputs"}, allowed=MANY_KEYS)
    spec = catalogue.get(_model_name(doc["model"]))
    inputs = doc["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInput("'inputs' must be a non-empty array")
    if len(inputs) > MAX_MANY_INPUTS:
        raise TooManyInputs(
            f"{len(inputs)} inputs in one request; at most {MAX_MANY_INPUTS} (split the batch)"
        )
    return ManySubmission(spec, inputs, _options(spec, doc, None, allow_private))


def prepare(spec: ModelSpec, raw: Any, limits: InputLimits) -> Prepared:
    """Validate one JSON input for ``spec`` and pick its bin (its kind's input form:
    carpool/core/kinds.py); first, its nesting and lengths against ``limits``."""
    check_input(raw, limits)
    return _READERS[kind_of(spec).input_form](spec, raw)


def input_limits(spec: ModelSpec) -> dict[str, Any]:
    """What /models shows of a model's input limits."""
    limits: dict[str, Any] = {"max_input_bytes": spec.max_input_bytes}
    form = kind_of(spec).input_form
    if form == "image":
        image = ImageLimits.of(spec)
        limits.update(max_side=image.max_side, max_pixels=image.max_pixels,
                      formats=list(ALLOWED_FORMATS))
    elif form == "text":
        limits["max_chars"] = _max_chars(spec)
    return limits


def _prepare_custom(spec: ModelSpec, raw: Any) -> Prepared:
    custom.validate(spec, raw)
    input_json = _encode(spec, raw)
    counter = _TEXT_MEASURES.get(spec.measure, count_tokens)
    return Prepared(input_json, spec.bin_for(custom.measure(spec, raw, input_json, counter)))


def _prepare_sized(spec: ModelSpec, raw: Any) -> Prepared:
    doc = _object(raw, "input", required={"value", "size"}, allowed={"value", "size"})
    size = _int("input.size", doc["size"], 0, None)
    input_json = _encode(spec, doc)
    return Prepared(input_json, spec.bin_for(size))


def _prepare_text(spec: ModelSpec, raw: Any) -> Prepared:
    counter = _TEXT_MEASURES.get(spec.measure)
    if counter is None:  # a text model binned by a measure no counter was registered for
        raise ConfigError(f"model {spec.name!r}: no text counter for measure {spec.measure!r}")
    doc = _object(raw, "input", required={"text"}, allowed={"text"})
    text = doc["text"]
    if not isinstance(text, str) or not text:
        raise InvalidInput("input.text must be a non-empty string")
    max_chars = _max_chars(spec)
    if len(text) > max_chars:
        raise InputTooLarge(f"input.text has {len(text)} characters; at most {max_chars}")
    bad = next((c for c in text if c in _CONTROL_CHARS), None)
    if bad is not None:
        raise InvalidInput(f"input.text holds the control character U+{ord(bad):04X} at "
                           f"position {text.index(bad)}; only tab and line breaks are allowed")
    input_json = _encode(spec, {"text": text})
    return Prepared(input_json, spec.bin_for(counter(spec, text)))


def _prepare_image_json(spec: ModelSpec, raw: Any) -> Prepared:
    doc = _object(raw, "input", required={"image_b64"}, allowed={"image_b64"})
    text = doc["image_b64"]
    if not isinstance(text, str):
        raise InvalidInput("input.image_b64 must be a base64 string")
    if len(text) // 4 * 3 > spec.max_input_bytes + 3:  # refuse before decoding it
        raise InputTooLarge(f"image is over {spec.max_input_bytes} bytes")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("input.image_b64 is not valid base64 (no line breaks)") from None
    return _prepare_image_bytes(spec, data)


def _prepare_image_bytes(spec: ModelSpec, data: bytes) -> Prepared:
    if len(data) > spec.max_input_bytes:
        raise InputTooLarge(f"image is {len(data)} bytes; at most {spec.max_input_bytes}")
    if not data:
        raise InvalidInput("the image is empty")
    info = probe(data, ImageLimits.of(spec))
    stored = {"image_b64": base64.b64encode(data).decode("ascii"), "format": info.format,
              "width": info.width, "height": info.height}
    return Prepared(json.dumps(stored, separators=(",", ":")), spec.bin_for(info.pixels))


def _encode(spec: ModelSpec, doc: Any) -> str:
    """Compact, canonical JSON of an input, within the model's byte limit."""
    try:
        text = json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        size = len(text.encode())
    except RecursionError:
        raise InvalidInput("input is nested too deeply") from None
    except UnicodeEncodeError:
        raise InvalidInput("input holds an unpaired surrogate (\\ud800-\\udfff)") from None
    if size > spec.max_input_bytes:
        raise InputTooLarge(
            f"input is {size} bytes as JSON; model {spec.name!r} takes at most "
            f"{spec.max_input_bytes}"
        )
    return text


def _object(
    raw: Any, what: str, *, required: AbstractSet[str], allowed: AbstractSet[str]
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidInput(f"{what} must be a JSON object with keys {sorted(required)}")
    missing, unknown = required - set(raw), set(raw) - set(allowed)
    if missing:
        raise InvalidInput(f"{what} lacks {sorted(missing)}")
    if unknown:
        raise InvalidInput(f"{what} has unknown keys {_names(unknown)}; allowed: {sorted(allowed)}")
    return raw


def _names(names: AbstractSet[str]) -> str:
    """A few of ``names``, each cut short: an error message never echoes a whole body."""
    shown = [n[:_MAX_NAME_CHARS] for n in sorted(names)[:_MAX_NAMES_SHOWN]]
    more = len(names) - len(shown)
    return str(shown) + (f" and {more} more" if more > 0 else "")


def _model_name(raw: Any) -> str:
    if not isinstance(raw, str):
        raise InvalidInput("'model' must be a string (see GET /models)")
    return raw


def _int(name: str, raw: Any, lo: int, hi: int | None) -> int:
    # bool is an int subclass in Python, but `true` is not a number in JSON.
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidInput(f"{name} must be an integer, got {json.dumps(raw)[:40]}")
    if raw < lo or (hi is not None and raw > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise InvalidInput(f"{name} must be {bound}, got {raw}")
    return raw


def _digits(name: str, raw: str) -> int:
    # The length bound first: int() of over 4300 digits raises ValueError (a 500).
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS):
        raise InvalidInput(f"{name} must be a non-negative integer, got {raw[:40]!r}")
    return int(raw)


def _options(spec: ModelSpec, doc: Mapping[str, Any], idempotency_key: str | None,
             allow_private: bool = False) -> Options:
    deadline, priority = doc.get("deadline_ms"), doc.get("priority")
    return Options(
        deadline_ms=(0 if deadline is None
                     else _int("deadline_ms", deadline, 1, spec.max_deadline_ms)),
        priority=(MIN_PRIORITY if priority is None
                  else _int("priority", priority, MIN_PRIORITY, MAX_PRIORITY)),
        idempotency_key=idempotency_key,
        hook=webhook_option(doc, allow_private),
        service_tier="" if doc.get("service_tier") is None else known_tier(doc["service_tier"]))


def _idempotency_key(body_key: Any, header_key: str | None) -> str | None:
    if body_key is not None and header_key is not None and body_key != header_key:
        raise InvalidInput("idempotency_key and the Idempotency-Key header differ; send one")
    key = header_key if body_key is None else body_key
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidInput(f"idempotency key must be a string of 1..{MAX_IDEMPOTENCY_KEY_CHARS}")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise InvalidInput("idempotency key holds an unpaired surrogate") from None
    return key


def _max_chars(spec: ModelSpec) -> int:
    return int_option(spec, "max_chars", DEFAULT_MAX_CHARS)


#: One reader per input form (carpool.core.kinds.INPUT_FORMS).
_READERS: dict[str, Callable[[ModelSpec, Any], Prepared]] = {
    "sized": _prepare_sized, "image": _prepare_image_json, "text": _prepare_text,
    "custom": _prepare_custom,
}
