"""A bulk batch's input file, checked whole before any line runs (status ``validating``).

Each line is ``{"custom_id", "method": "POST", "url", "body"}``; ``url`` is the
batch's endpoint, ``/v1/embeddings`` (OpenAI's embeddings body,
carpool/intake/embeddings.py) or ``/submit`` (carpool's own body, carpool/intake/inputs.py).
Every line names the same model (as OpenAI requires). A file with any bad line
fails as a whole, with one error per bad line (its 1-based line number), at
most MAX_ERRORS of them; empty lines are skipped, as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from carpool.core.catalogue import BinSpec, Catalogue, ModelSpec
from carpool.core.errors import CarpoolError
from carpool.core.input_limits import InputLimits
from carpool.core.strict_json import parse_json
from carpool.intake import inputs
from carpool.intake.embeddings import embed_request

ENDPOINTS = ("/v1/embeddings", "/submit")
#: Errors listed for a failed file; past it the last error says how many more.
MAX_ERRORS = 100
#: Longest custom_id (OpenAI documents none; 512 keeps a line's id readable).
MAX_CUSTOM_ID_CHARS = 512
#: Strings in one embeddings line: a line is one request, and its jobs end together.
MAX_TEXTS_PER_LINE = 256
_LINE_KEYS = frozenset({"custom_id", "method", "url", "body"})


@dataclass(frozen=True)
class Job:
    bin: BinSpec
    input_json: str


@dataclass(frozen=True)
class Line:
    index: int  # 0-based, among the file's non-empty lines
    custom_id: str
    jobs: tuple[Job, ...]
    encoding_format: str  # embeddings only: how the answer carries vectors
    #: Embeddings only: the vector size the line asked for (None: any), checked against
    #: the model's answer as ``POST /v1/embeddings`` checks it.
    dimensions: int | None = None


@dataclass(frozen=True)
class Parsed:
    spec: ModelSpec | None
    lines: list[Line]
    errors: list[dict[str, Any]]


def parse_file(data: bytes, endpoint: str, catalogue: Catalogue, limits: InputLimits,
               max_lines: int) -> Parsed:
    """Every line checked; ``errors`` empty when the batch may run."""
    errors: list[dict[str, Any]] = []
    lines: list[Line] = []
    seen: set[str] = set()
    spec: ModelSpec | None = None
    for number, raw in _numbered(data):
        if len(lines) >= max_lines:
            errors.append(_error("too_many_lines", f"the file has more than {max_lines} "
                                 "requests (CARPOOL_BATCH_MAX_LINES)", number))
            break
        try:
            line, model = _line(raw, len(lines), endpoint, catalogue, limits)
            if line.custom_id in seen:
                raise CarpoolError(f"custom_id {line.custom_id[:80]!r} is used by an "
                                   "earlier line: each must be unique")
            if spec is not None and model.name != spec.name:
                raise CarpoolError(f"model {model.name!r} differs from the first line's "
                                   f"{spec.name!r}: a batch serves one model")
        except CarpoolError as exc:
            errors.append(_error("invalid_request", str(exc), number))
            if len(errors) >= MAX_ERRORS:
                errors.append(_error("too_many_errors", "more errors follow; fix these "
                                     "first", number))
                break
            continue
        spec = model
        seen.add(line.custom_id)
        lines.append(line)
    if not lines and not errors:
        errors.append(_error("empty_file", "the file has no requests", None))
    return Parsed(spec, lines, errors)


def _numbered(data: bytes) -> Iterator[tuple[int, bytes]]:
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            yield number, raw


def _line(raw: bytes, index: int, endpoint: str, catalogue: Catalogue, limits: InputLimits
          ) -> tuple[Line, ModelSpec]:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CarpoolError(f"not UTF-8 (byte {exc.start + 1} of the line)") from None
    doc = parse_json(raw, "the line")  # its messages' "line 1" is then this line's
    if not isinstance(doc, dict):
        raise CarpoolError("a line must be a JSON object {custom_id, method, url, body}")
    missing, unknown = _LINE_KEYS - set(doc), set(doc) - _LINE_KEYS
    if missing or unknown:
        raise CarpoolError(f"a line holds exactly custom_id, method, url and body; "
                           f"missing {sorted(missing)}, unknown {sorted(unknown)[:5]}")
    custom_id = doc["custom_id"]
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        raise CarpoolError(f"custom_id must be a string of 1..{MAX_CUSTOM_ID_CHARS} characters")
    if doc["method"] != "POST":
        raise CarpoolError("method must be 'POST'")
    if doc["url"] != endpoint:
        raise CarpoolError(f"url {str(doc['url'])[:80]!r} differs from the batch's endpoint "
                           f"{endpoint!r}")
    if endpoint == "/v1/embeddings":
        req = embed_request(doc["body"], catalogue, limits, MAX_TEXTS_PER_LINE)
        jobs = tuple(Job(p.bin, p.input_json) for p in req.prepared)
        return Line(index, custom_id, jobs, req.encoding_format,
                    doc["body"].get("dimensions")), req.spec
    # A line's webhook is never called (the batch's is): its address is not judged.
    sub = inputs.submission_from_json(doc["body"], catalogue, limits, None,
                                      allow_private=True)
    return Line(index, custom_id, (Job(sub.prepared.bin, sub.prepared.input_json),),
                ""), sub.spec


def _error(code: str, message: str, line: int | None) -> dict[str, Any]:
    """One entry of the batch's ``errors.data`` (OpenAI's shape)."""
    return {"code": code, "message": message[:500], "param": None, "line": line}
