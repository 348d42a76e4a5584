"""OpenAI's Batches API (``/v1/batches``) and the synchronous ``/v1/embeddings``.

A batch is created ``validating``; the feeder (``python -m feeder``) checks
its file, feeds its lines into the model's bins and writes its output and error
files (docs/batches.md). Cancel asks the feeder to stop: ``cancelling`` until the
lines in flight end, then ``cancelled``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from flask import Blueprint, Request, Response, jsonify, request

from carpool.admission.tiers import known_tier
from carpool.backend.admissions import AdmitJob
from carpool.backend.bulkdb import bulk_document, new_bulk_id
from carpool.backend.outbox import webhook_doc
from carpool.core.bulk import BulkStatus, BulkView
from carpool.core.bulk_settings import MAX_WINDOW_S
from carpool.core.errors import BatchEnded, InvalidInput
from carpool.core.jobs import JobStatus, new_job_id
from carpool.core.strict_json import parse_json
from carpool.core.webhooks import check_url
from carpool.intake.bulk_lines import ENDPOINTS
from carpool.intake.embeddings import check_dimensions, embed_request, embeddings_answer
from web.common.auth import request_owner, service_tier
from web.common.lean import Answer, LeanRoute, flask_answer
from web.common.metrics import remember_model
from web.common.refusals import JobFailed, ResourceNotFound, ResultsLate
from web.common.state import WebState, current_state
from web.common.sync_wait import SyncWait
from web.openai.files import owned_file, page_args, page_document

blueprint = Blueprint("v1_batches", __name__, url_prefix="/v1")
# Bodies read within their limits and time, as on /submit (web/common/bodies.py).

#: A completion window: OpenAI's "24h", or a shorter one in s, m or h (carpool's own).
_WINDOW = re.compile(r"([1-9][0-9]{0,5})([smh])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
#: Metadata as OpenAI bounds it: 16 pairs, keys of 64 and values of 512 characters.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
#: "webhook" is carpool's own (the SDK sends it with extra_body): where the batch's
#: end is POSTed (docs/batches.md, "Webhooks"). "service_tier" is OpenAI's name for
#: the tier asked for, sent with extra_body too: its lines are admitted under it.
_CREATE_KEYS = frozenset({"input_file_id", "endpoint", "completion_window", "metadata",
                          "webhook", "service_tier"})


def window_s(text: Any) -> int:
    # fullmatch: "$" also matches before a final newline, which "24h\n" would keep.
    match = _WINDOW.fullmatch(text) if isinstance(text, str) else None
    seconds = int(match[1]) * _UNIT_S[match[2]] if match else 0
    if not 0 < seconds <= MAX_WINDOW_S:
        raise InvalidInput("completion_window must be '24h' (or a shorter window such as "
                           f"'30m' or '90s'), got {str(text)[:20]!r}")
    return seconds


def _metadata(raw: Any) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, dict) or len(raw) > MAX_METADATA_PAIRS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY
            and len(v) <= MAX_METADATA_VALUE for k, v in raw.items()):
        raise InvalidInput(f"metadata must be an object of at most {MAX_METADATA_PAIRS} "
                           f"string pairs (keys <= {MAX_METADATA_KEY}, values <= "
                           f"{MAX_METADATA_VALUE} characters)")
    return json.dumps(raw)


@blueprint.post("/batches")
def create_bulk() -> tuple[Response, int]:
    state = current_state()
    owner = request_owner(state.settings, request)
    doc = parse_json(request.get_data())
    if not isinstance(doc, dict) or set(doc) - _CREATE_KEYS:
        raise InvalidInput(f"the body must be an object with {sorted(_CREATE_KEYS)}")
    if doc.get("endpoint") not in ENDPOINTS:
        raise InvalidInput(f"endpoint must be one of {list(ENDPOINTS)}")
    # Decided once, here: the feeder admits every line under it, after a restart too.
    tier = service_tier(state.settings, owner, request, "" if doc.get("service_tier") is None
                        else known_tier(doc["service_tier"]))
    file_id = doc.get("input_file_id")
    if not isinstance(file_id, str):
        raise InvalidInput("input_file_id must be the id of a file uploaded with "
                           "purpose 'batch'")
    meta = owned_file(state, file_id, owner)
    if meta["purpose"] != "batch":
        raise InvalidInput(f"file {file_id} has purpose {meta['purpose']!r}, not 'batch'")
    window = window_s(doc.get("completion_window"))
    webhook = doc.get("webhook")
    if webhook is not None:
        webhook = check_url(webhook, state.settings.webhooks.allow_private).url
    now = int(time.time())
    fields: dict[str, str | int] = {
        "id": new_bulk_id(), "owner": owner, "endpoint": doc["endpoint"],
        "input_file_id": file_id, "completion_window": doc["completion_window"],
        "window_s": window, "metadata": _metadata(doc.get("metadata")),
        "created_at": now, "expires_at": now + window, "status": BulkStatus.VALIDATING.value,
        "total": 0, "completed": 0, "failed": 0, "chunks": 0, "webhook": webhook or "",
        "service_tier": tier,
    }
    state.bulkdb.add_bulk(fields, state.settings.bulk.keep_s)
    return jsonify(bulk_document(BulkView.from_hash({k: str(v) for k, v in fields.items()}))), 200


def _owned_bulk(state: WebState, batch_id: str, owner: str) -> BulkView:
    view = state.bulkdb.bulk(batch_id[:64]) if batch_id.startswith("batch_") else None
    if view is None or view.owner != owner:
        raise ResourceNotFound(f"no batch {batch_id[:64]!r}")
    return view


@blueprint.get("/batches/<batch_id>")
def retrieve_bulk(batch_id: str) -> Response:
    """The batch; with a webhook, its delivery as a job's document shows one
    (``carpool.webhook_delivery``: docs/batches.md)."""
    state = current_state()
    view = _owned_bulk(state, batch_id, request_owner(state.settings, request))
    doc = bulk_document(view)
    if view.webhook:
        doc["carpool"]["webhook_delivery"] = webhook_doc(state.bulkdb.deliveries(view.id))
    return jsonify(doc)


@blueprint.post("/batches/<batch_id>/cancel")
def cancel_bulk(batch_id: str) -> Response:
    state = current_state()
    owner = request_owner(state.settings, request)
    _owned_bulk(state, batch_id, owner)
    if not state.bulkdb.move(batch_id, (BulkStatus.VALIDATING, BulkStatus.IN_PROGRESS),
                             BulkStatus.CANCELLING, cancelling_at=int(time.time())):
        status = _owned_bulk(state, batch_id, owner).status
        if status.final and status is not BulkStatus.CANCELLED:
            raise BatchEnded(f"batch {batch_id} is {status.value}: nothing to cancel")
    return jsonify(bulk_document(_owned_bulk(state, batch_id, owner)))


@blueprint.get("/batches")
def list_bulk() -> Response:
    state = current_state()
    limit, after = page_args()
    page = state.bulkdb.list_bulk(request_owner(state.settings, request), after, limit)
    return jsonify(page_document([bulk_document(h) for h in page.items], page.has_more))


@blueprint.post("/embeddings")
def embeddings() -> Response:
    return flask_answer(embeddings_of(request))


def embeddings_of(req: Request) -> Answer:
    """One job per string, all queued or none (web/common/sync_wait.py, as /v2 infer);
    answers when all end (within CARPOOL_MAX_WAIT_S, else 504). By Flask or the lean
    routes (web/common/lean.py)."""
    state = current_state()
    owner = request_owner(state.settings, req)
    doc = parse_json(req.get_data())
    remember_model(doc)
    asked = embed_request(doc, state.routing.catalogue(), state.settings.input_limits)
    jobs = [AdmitJob(p.bin, new_job_id(asked.spec.name), p.input_json) for p in asked.prepared]
    with SyncWait(state, owner, state.settings.max_wait_s, slot_required=True,
                  req=req) as sync:
        views = sync.finals(sync.admit_all(sync.request(asked.spec, jobs,
                                                         tier_asked=asked.service_tier)))
    results = []
    for i, view in enumerate(views):
        if view is None:
            raise ResultsLate(f"input[{i}] did not end within {sync.wait_s:g} s "
                              "(CARPOOL_MAX_WAIT_S, or the caller's X-Carpool-Timeout); try "
                              "again, or use /v1/batches")
        if view.status is not JobStatus.DONE:
            raise JobFailed(f"input[{i}] {view.status.value}: {view.error}")
        results.append(view.result)
    check_dimensions(doc, results)
    return Answer(embeddings_answer(asked.spec, results, asked.encoding_format))


#: The synchronous OpenAI call, answered in front of Flask's dispatch.
LEAN_ROUTES = (LeanRoute("POST", "/v1/embeddings", "v1_batches.embeddings", embeddings_of),)
