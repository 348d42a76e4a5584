"""OpenAI's Files API (``/v1/files``) for batch inputs and outputs.

Metadata in Redis (carpool/backend/bulkdb.py), bytes in the file store
(carpool/backend/filestore.py). Files are scoped to the API key that made them:
another key's file answers the same 404 as an unknown id.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from flask import Blueprint, Response, jsonify, request

from carpool.backend.bulkdb import file_document, new_file_id
from carpool.backend.filestore import store_name
from carpool.core.errors import InvalidInput
from web.common.auth import request_owner
from web.common.bodies import multipart_parts
from web.common.refusals import BodyTooLarge, ResourceNotFound
from web.common.state import WebState, current_state

blueprint = Blueprint("v1_files", __name__, url_prefix="/v1")
# Bodies read within their limits and time, as on /submit (web/common/bodies.py).

#: Purposes a client may upload; ``batch_output`` files are the feeder's.
UPLOAD_PURPOSES = ("batch",)
#: Longest filename kept (a name is only shown back).
MAX_FILENAME_CHARS = 255
#: Items in one page of a listing at most, and by default (OpenAI's numbers).
MAX_PAGE, DEFAULT_PAGE = 10_000, 20


@blueprint.post("/files")
def create_file() -> tuple[Response, int]:
    state = current_state()
    owner = request_owner(state.settings, request)
    if request.mimetype != "multipart/form-data":
        raise InvalidInput("upload a file as multipart/form-data with fields 'file' and "
                           "'purpose'")
    form, files = multipart_parts(request)
    purpose = form.get("purpose", "")
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidInput(f"purpose must be one of {list(UPLOAD_PURPOSES)}, got "
                           f"{purpose[:40]!r}")
    if [name for name, _ in files] != ["file"]:
        raise InvalidInput("send exactly one file, in the form field 'file'")
    limit = state.settings.bulk.max_file_bytes
    upload = files[0][1]
    data = upload.read(limit + 1)
    if len(data) > limit:
        raise BodyTooLarge(f"the file is over {limit} bytes (CARPOOL_BATCH_MAX_FILE_BYTES)")
    if not data:
        raise InvalidInput("the file is empty")
    meta: dict[str, str | int] = {
            "id": new_file_id(), "bytes": len(data), "created_at": int(time.time()),
            "filename": (upload.filename or "upload.jsonl")[:MAX_FILENAME_CHARS],
            "purpose": purpose, "owner": owner}
    state.files.put(store_name(str(meta["id"])), data)  # the bytes first: a record never
    state.bulkdb.add_file(meta, state.settings.bulk.keep_s)  # names a missing file
    return jsonify(file_document({k: str(v) for k, v in meta.items()})), 200


@blueprint.get("/files/<file_id>")
def retrieve_file(file_id: str) -> Response:
    state = current_state()
    owner = request_owner(state.settings, request)
    return jsonify(file_document(owned_file(state, file_id, owner)))


@blueprint.get("/files/<file_id>/content")
def file_content(file_id: str) -> Response:
    state = current_state()
    owned_file(state, file_id, request_owner(state.settings, request))
    pieces = state.files.stream(store_name(file_id))
    # The first piece is read here, where a store that is down answers 503 (in the
    # streamed body, after the 200, it could only break the response: a 500 page).
    first = next(pieces, None)
    if first is None:  # no stored file is empty: an upload of none is refused, an
        # output without lines is never written; so its object is gone from the store
        raise ResourceNotFound(f"file {file_id[:64]}: its bytes are gone from the file store")
    return Response(itertools.chain((first,), pieces), mimetype="application/octet-stream")


@blueprint.delete("/files/<file_id>")
def delete_file(file_id: str) -> Response:
    state = current_state()
    owner = request_owner(state.settings, request)
    owned_file(state, file_id, owner)
    # The bytes first: a store that is down (503) leaves the record for a retry to
    # find; dropped first, the retry answered 404 and the bytes stayed for good. A record
    # left without its bytes (Redis down now) answers its content 404, as if deleted.
    state.files.delete(store_name(file_id))
    state.bulkdb.drop_file(file_id, owner)
    return jsonify({"id": file_id, "object": "file", "deleted": True})


@blueprint.get("/files")
def list_files() -> Response:
    state = current_state()
    owner = request_owner(state.settings, request)
    limit, after = page_args()
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidInput(f"order must be 'asc' or 'desc', got {order[:20]!r}")
    page = state.bulkdb.list_files(owner, after, limit, request.args.get("purpose"),
                                   oldest_first=order == "asc")
    return jsonify(page_document([file_document(h) for h in page.items], page.has_more))


def owned_file(state: WebState, file_id: str, owner: str) -> dict[str, str]:
    meta = state.bulkdb.file(file_id[:64]) if file_id.startswith("file-") else None
    if meta is None or meta.get("owner", "") != owner:
        raise ResourceNotFound(f"no file {file_id[:64]!r}")
    return meta


def page_args() -> tuple[int, str]:
    """``limit`` and ``after`` of a listing request."""
    raw = request.args.get("limit", str(DEFAULT_PAGE))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and 1 <= int(raw) <= MAX_PAGE):
        raise InvalidInput(f"limit must be an integer 1..{MAX_PAGE}, got {raw[:20]!r}")
    return int(raw), request.args.get("after", "")[:64]


def page_document(docs: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": docs, "has_more": has_more,
            "first_id": docs[0]["id"] if docs else None,
            "last_id": docs[-1]["id"] if docs else None}
