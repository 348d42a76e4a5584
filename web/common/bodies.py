"""Request bodies, read with limits before anything parses them.

A body is refused (413) from its ``Content-Length`` alone when it is over the
limit of what it can be, before a byte of it is read; a chunked body is read up
to that limit and refused at the first byte past it. Each limit follows from
the catalogue: a raw image for ``?model=m`` may be as large as m's
``max_input_bytes``; a JSON submit as large as the largest JSON any model takes
(an image as base64 is 4/3 of its bytes); /submit/batch up to ``CARPOOL_MAX_BODY_BYTES``.

A body must also arrive in time: ``CARPOOL_BODY_TIMEOUT_S``, plus a second per
``CARPOOL_BODY_MIN_RATE`` bytes received (Apache's mod_reqtimeout rule), else 408
and the connection closes. A client that sends headers and one byte otherwise
holds a connection slot for as long as it likes. After a 408 or 413 the
connection stays open for what is left of the body: gunicorn reads and drops it
before the next request, for at most its keep-alive time (2 s), then closes. (Closing
it here instead would race a client that already reuses the connection.)

A chunked body that breaks its framing (a chunk size that is not hex, a chunk
without its CRLF, a bad trailer) answers 400; one the client stops sending before
its end (it closes mid-chunk, or sends less than its ``Content-Length``) answers 408.
Either way gunicorn closes the connection: where the next request would start is
unknown. A compressed body (``Content-Encoding``) answers 415: no route inflates one.

Then ``parse_json`` (carpool/core/strict_json.py) refuses a document with more JSON values than
any input needs, before it builds them: a 16 MiB array of empty objects is a
gigabyte of Python objects.
"""

from __future__ import annotations

import functools
import io
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from flask import Request
from gunicorn.http.errors import NoMoreData, ParseException

from carpool.core.catalogue import ModelSpec
from carpool.core.settings import Settings
from web.common.refusals import BodyCutShort, BodyTimeout, BodyTooLarge, MalformedBody

#: Room in a JSON body for the envelope: model, options, idempotency key.
ENVELOPE_BYTES = 16 << 10
#: A JSON input as a client may write it, against its compact stored form: spaces,
#: and \\uXXXX escapes (6 bytes for a character that UTF-8 stores in 2).
JSON_SLACK_FACTOR = 3
#: A multipart body's boundaries, part headers and small form fields.
MULTIPART_SLACK_BYTES = 16 << 10
#: Bytes read from the client per step; the deadline is checked between steps.
READ_CHUNK_BYTES = 64 << 10
#: Characters of gunicorn's account of a framing error quoted back: it may echo a
#: chunk-size line of up to 8 KiB.
MAX_QUOTED_CHARS = 120


def json_limit_bytes(spec: ModelSpec) -> int:
    """The largest JSON submit body that can hold one valid input of ``spec``."""
    if spec.measure == "pixels":
        return math.ceil(spec.max_input_bytes / 3) * 4 + ENVELOPE_BYTES
    return spec.max_input_bytes * JSON_SLACK_FACTOR + ENVELOPE_BYTES


class BodyLimits:
    """Each kind of request body's byte limit, worked out once from the settings."""

    def __init__(self, settings: Settings) -> None:
        cap = settings.max_body_bytes
        specs = list(settings.catalogue)
        pixels = [s.max_input_bytes for s in specs if s.measure == "pixels"]
        #: Many inputs at once (/submit/batch, /v1/embeddings): the whole cap.
        self.many = cap
        self.json = min(cap, max((json_limit_bytes(s) for s in specs), default=ENVELOPE_BYTES))
        self.multipart = min(cap, max(pixels, default=0) + MULTIPART_SLACK_BYTES)
        self.any_image = min(cap, max(pixels, default=0))
        self.image = {s.name: min(cap, s.max_input_bytes) for s in specs}
        #: An infer request (/v2): as many rows as the model batches, each as JSON.
        self.infer = {s.name: min(cap, max(b.max_batch for b in s.bins) * json_limit_bytes(s))
                      for s in specs}
        #: A bulk batch's input file (CARPOOL_BATCH_MAX_FILE_BYTES) in its multipart envelope.
        self.upload = settings.bulk.max_file_bytes + MULTIPART_SLACK_BYTES

    @property
    def largest(self) -> int:
        return max(self.many, self.upload)

    def for_request(self, path: str, mimetype: str, model: str | None) -> int:
        if path in ("/submit/batch", "/v1/embeddings"):
            return self.many
        infer_model = _infer_model(path)
        if infer_model is not None:
            return self.infer.get(infer_model, self.json)
        if path == "/v1/files":
            return self.upload
        if mimetype.startswith("image/"):
            return self.image.get(model or "", self.any_image)
        if mimetype == "multipart/form-data":
            return self.multipart
        return self.json


def _infer_model(path: str) -> str | None:
    """The model of a /v2 infer path (``/v2/models/<m>[/versions/<v>]/infer``), else None."""
    parts = path.split("/")
    if len(parts) in (5, 7) and parts[:3] == ["", "v2", "models"] and parts[-1] == "infer":
        return parts[3]
    return None


def read_body(settings: Settings, limits: BodyLimits, req: Request) -> None:
    """Read this POST's body within its limits, and leave it for Flask to parse.

    Raises BodyTooLarge (413), BodyTimeout or BodyCutShort (408), MalformedBody (400).
    """
    environ = req.environ
    mimetype = req.mimetype
    # ?model= matters only for a raw image; looking up an absent argument raises and
    # catches a KeyError inside werkzeug, so it is not asked of every JSON body.
    model = req.args.get("model") if mimetype.startswith("image/") else None
    limit = limits.for_request(req.path, mimetype, model)
    length = req.content_length
    if length is not None and length > limit:
        raise _too_large(f"{length} bytes", limit)
    want = limit + 1 if length is None else length  # chunked: one byte past tells
    body = _read(environ, want, settings)
    if len(body) > limit:
        raise _too_large("longer", limit)
    if length is not None and len(body) < length:
        raise _cut_short(f": {len(body)} of the {length} bytes its Content-Length announced")
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    environ["wsgi.input_terminated"] = False


def _too_large(size: str, limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body is {size}, over {limit} bytes: at most {limit} for "
                        "this request (its model's input limit; docs/operations.md)")


def _read(environ: dict[str, Any], want: int, settings: Settings) -> bytes:
    stream: BinaryIO = environ["wsgi.input"]
    sock = environ.get("gunicorn.socket")
    start = time.monotonic()
    parts: list[bytes] = []
    got = 0
    while got < want:
        allowed_s = settings.body_timeout_s + got / settings.body_min_rate_bytes_per_s
        remaining_s = start + allowed_s - time.monotonic()
        if remaining_s <= 0:
            raise _late(settings, got)
        try:
            with _deadline(sock, remaining_s):
                chunk = stream.read(min(READ_CHUNK_BYTES, want - got))
        except TimeoutError:
            raise _late(settings, got) from None
        except NoMoreData:  # gunicorn's chunked reader met the end of the stream
            raise _cut_short(" (its last chunk never came)") from None
        except ParseException as exc:  # gunicorn's chunked reader: framing broken
            raise MalformedBody(
                "the request body is not valid chunked transfer encoding (RFC 9112 7.1): "
                f"{str(exc)[:MAX_QUOTED_CHARS]}") from None
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _cut_short(detail: str) -> BodyCutShort:
    return BodyCutShort(f"the client stopped sending the request body before its end{detail}; "
                        "send it whole")


def _late(settings: Settings, got: int) -> BodyTimeout:
    return BodyTimeout(
        f"the request body did not arrive in time ({got} bytes received; allowed: "
        f"{settings.body_timeout_s:g} s plus 1 s per {settings.body_min_rate_bytes_per_s} "
        "bytes received)")


@contextmanager
def _deadline(sock: Any, seconds: float) -> Iterator[None]:
    """Bound one read: a gevent timeout under gunicorn's gevent worker (it bounds the
    whole read, however slowly the bytes drip), else the socket's own timeout."""
    timeout = _gevent_timeout(seconds)
    if timeout is not None:
        timeout.start()
        try:
            yield
        except BaseException as exc:
            if exc is timeout:
                raise TimeoutError from None
            raise
        finally:
            timeout.cancel()
        return
    if sock is None:
        yield
        return
    before = sock.gettimeout()
    sock.settimeout(seconds)
    try:
        yield
    finally:
        sock.settimeout(before)


def _gevent_timeout(seconds: float) -> Any:
    """A gevent Timeout where gevent runs this process (gunicorn's gevent worker)."""
    timeout = _gevent_timeout_class()
    return timeout(seconds) if timeout is not None else None


@functools.cache
def _gevent_timeout_class() -> Any:
    """gevent's Timeout, or None without gevent; patching precedes the app's import,
    so the answer never changes in a process."""
    try:
        from gevent import Timeout, monkey
    except ImportError:
        return None
    return Timeout if monkey.is_module_patched("socket") else None


def multipart_parts(req: Request) -> tuple[dict[str, str], list[tuple[str, Any]]]:
    """The form fields and the (name, file) parts of a multipart body. werkzeug drops
    the whole form, silently, at a part it cannot parse (headers not UTF-8, a part
    without a name), so a body that yields no part at all is refused as malformed:
    the client learns that, not that a field it did send is missing."""
    fields, files = req.form.to_dict(), list(req.files.items(multi=True))
    if not fields and not files:
        raise MalformedBody("no part of the multipart body could be read: each part needs "
                            "a Content-Disposition header with a name, and headers in UTF-8")
    return fields, files
