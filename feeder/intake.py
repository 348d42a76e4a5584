"""A bulk batch's input file, as the feeder meets it: validated, loaded into a Run, watched.

The input may go away at any time (``files.delete``, or from under the file store).
Before validation the batch then fails with no lines; after it, the feeder marks the
batch ``input_lost_at`` (kept in Redis, so a restart decides the same) and winds it
down: what finished stays, the rest go to the error file (docs/batches.md).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

from carpool.admission.tiers import TIERS
from carpool.backend.bulkdb import BulkDb
from carpool.backend.filestore import FileStore, store_name
from carpool.core.bulk import BulkStatus, BulkView
from carpool.core.settings import Settings
from carpool.intake.bulk_lines import parse_file
from feeder.labels import drop_labels, of_lines, read_labels, write_labels
from feeder.metrics import FeederMetrics
from feeder.run import Run, stored_set

log = logging.getLogger("carpool.feeder")

#: How often a running batch's input file is looked for, in seconds: a deleted input
#: stops the batch within about this long (one HEAD a batch on S3).
INPUT_CHECK_EVERY_S = 1.0


def validate(settings: Settings, db: BulkDb, store: FileStore, metrics: FeederMetrics,
             view: BulkView) -> None:
    """Check the whole file: ``in_progress`` (with its lines' labels written first),
    ``failed`` with one error per bad line, or ``cancelled`` if cancelled meanwhile."""
    bulk_id = view.id
    data = store.get(store_name(view.input_file_id))
    if data is None:
        errors = [{"code": "input_file_deleted", "param": "input_file_id", "line": None,
                   "message": f"the input file {view.input_file_id} was deleted before "
                              "the batch started"}]
    else:
        parsed = parse_file(data, view.endpoint, settings.catalogue, settings.input_limits,
                            settings.bulk.max_lines)
        errors = parsed.errors
    # Read after the parse (seconds for a large file): a cancel that came meanwhile
    # has its cancelling_at before the batch's end, never after.
    now = int(time.time())
    if errors:
        if db.move(bulk_id, (BulkStatus.VALIDATING,), BulkStatus.FAILED, failed_at=now,
                   errors=json.dumps({"object": "list", "data": errors})):
            metrics.ended.labels("failed").inc()
        elif db.move(bulk_id, (BulkStatus.CANCELLING,), BulkStatus.CANCELLED,
                     cancelled_at=now):
            metrics.ended.labels("cancelled").inc()
        return
    assert parsed.spec is not None
    write_labels(store, bulk_id, parsed.lines)
    now = int(time.time())  # the labels' writing took time too
    if not db.move(bulk_id, (BulkStatus.VALIDATING,), BulkStatus.IN_PROGRESS,
                   in_progress_at=now, total=len(parsed.lines), model=parsed.spec.name):
        drop_labels(store, bulk_id)
        if db.move(bulk_id, (BulkStatus.CANCELLING,), BulkStatus.CANCELLED, cancelled_at=now,
                   total=len(parsed.lines), model=parsed.spec.name):
            metrics.ended.labels("cancelled").inc()


def load(settings: Settings, db: BulkDb, store: FileStore, view: BulkView) -> Run:
    """The batch as Redis and the file store have it. Without its input file, a Run with
    no lines to feed, its lines named by the labels written at validation."""
    bulk_id = view.id
    if view.service_tier not in TIERS:
        raise ValueError(f"its service_tier {view.service_tier[:40]!r} is not one of "
                         f"{', '.join(TIERS)}")
    lost = view.input_lost_at is not None
    data = None if lost else store.get(store_name(view.input_file_id))
    if data is None:
        if view.model is None:
            raise LookupError(f"its input file {view.input_file_id} was deleted")
        spec, lines = settings.catalogue.get(view.model), []
        labels = read_labels(store, bulk_id, view.counts.total)
    else:
        parsed = parse_file(data, view.endpoint, settings.catalogue, settings.input_limits,
                            settings.bulk.max_lines)
        if parsed.spec is None or parsed.errors:
            raise ValueError("its input file no longer passes validation (the catalogue "
                             "changed?)")
        spec, lines, labels = parsed.spec, parsed.lines, of_lines(parsed.lines)
    jobs, bitmap = db.line_state(bulk_id)
    run = Run(bulk_id, view.owner, spec, view.endpoint, lines, labels,
              float(view.expires_at), view.chunks, jobs, stored_set(bitmap),
              input_gone=data is None, tier=view.service_tier)
    run.sampled = (time.monotonic(), len(run.stored))
    run.advance()
    return run


def watch(db: BulkDb, store: FileStore, run: Run, view: BulkView) -> BulkView:
    """Mark a running batch ``input_lost_at`` (in Redis and in the view it returns) once
    its input file is gone while some line has not finished. Looked for every
    INPUT_CHECK_EVERY_S."""
    if (view.status is not BulkStatus.IN_PROGRESS or view.input_lost_at is not None
            or len(run.stored) == run.total):
        return view
    if not run.input_gone:
        now = time.monotonic()
        if now - run.input_checked_at < INPUT_CHECK_EVERY_S:
            return view
        run.input_checked_at = now
        run.input_gone = not store.exists(store_name(view.input_file_id))
    if not run.input_gone:
        return view
    log.warning("batch %s: its input file %s is gone; %d lines will not run", run.id,
                view.input_file_id, run.total - len(run.stored) - len(run.jobs))
    lost_at = int(time.time())
    db.set_fields(run.id, input_lost_at=lost_at)
    return replace(view, input_lost_at=lost_at)
