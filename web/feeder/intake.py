"""A batch's input file, as the feeder meets it: validated, loaded into a Run, watched.

The input may go away at any time (``files.delete``, or from under the file store).
Before validation the batch then fails with no lines; after it, the feeder marks the
batch ``input_lost_at`` (kept in Redis, so a restart decides the same) and winds it
down: what finished stays, the rest go to the error file (docs/batches.md).
"""

from __future__ import annotations

import json
import logging
import time

from carpool.backend.batchdb import BatchDb
from carpool.backend.filestore import FileStore
from carpool.core.settings import Settings
from web.batchlines import parse_file
from web.feeder.labels import drop_labels, of_lines, read_labels, write_labels
from web.feeder.metrics import FeederMetrics
from web.feeder.run import Run, stored_set
from web.v1_files import store_name

log = logging.getLogger("carpool.feeder")

#: How often a running batch's input file is looked for, in seconds: a deleted input
#: stops the batch within about this long (one HEAD a batch on S3).
INPUT_CHECK_EVERY_S = 1.0


def validate(settings: Settings, db: BatchDb, store: FileStore, metrics: FeederMetrics,
             batch_id: str, h: dict[str, str]) -> None:
    """Check the whole file: ``in_progress`` (with its lines' labels written first),
    ``failed`` with one error per bad line, or ``cancelled`` if cancelled meanwhile."""
    data = store.get(store_name(h["input_file_id"]))
    now = int(time.time())
    if data is None:
        errors = [{"code": "input_file_deleted", "param": "input_file_id", "line": None,
                   "message": f"the input file {h['input_file_id']} was deleted before "
                              "the batch started"}]
    else:
        parsed = parse_file(data, h["endpoint"], settings.catalogue, settings.input_limits,
                            settings.batches.max_lines)
        errors = parsed.errors
    if errors:
        if db.move(batch_id, ("validating",), "failed", failed_at=now,
                   errors=json.dumps({"object": "list", "data": errors})):
            metrics.ended.labels("failed").inc()
        elif db.move(batch_id, ("cancelling",), "cancelled", cancelled_at=now):
            metrics.ended.labels("cancelled").inc()
        return
    assert parsed.spec is not None
    write_labels(store, batch_id, parsed.lines)
    if not db.move(batch_id, ("validating",), "in_progress", in_progress_at=now,
                   total=len(parsed.lines), model=parsed.spec.name):
        drop_labels(store, batch_id)
        if db.move(batch_id, ("cancelling",), "cancelled", cancelled_at=now,
                   total=len(parsed.lines), model=parsed.spec.name):
            metrics.ended.labels("cancelled").inc()


def load(settings: Settings, db: BatchDb, store: FileStore, batch_id: str,
         h: dict[str, str]) -> Run:
    """The batch as Redis and the file store have it. Without its input file, a Run with
    no lines to feed, its lines named by the labels written at validation."""
    data = None if "input_lost_at" in h else store.get(store_name(h["input_file_id"]))
    if data is None:
        spec, lines = settings.catalogue.get(h["model"]), []
        labels = read_labels(store, batch_id, int(h.get("total", 0)))
    else:
        parsed = parse_file(data, h["endpoint"], settings.catalogue, settings.input_limits,
                            settings.batches.max_lines)
        if parsed.spec is None or parsed.errors:
            raise ValueError("its input file no longer passes validation (the catalogue "
                             "changed?)")
        spec, lines, labels = parsed.spec, parsed.lines, of_lines(parsed.lines)
    jobs, bitmap = db.line_state(batch_id)
    run = Run(batch_id, h.get("owner", ""), spec, h["endpoint"], lines, labels,
              float(h["expires_at"]), int(h.get("chunks", 0)), jobs, stored_set(bitmap),
              input_gone=data is None)
    run.sampled = (time.monotonic(), len(run.stored))
    run.advance()
    return run


def watch(db: BatchDb, store: FileStore, run: Run, h: dict[str, str]) -> None:
    """Mark a running batch ``input_lost_at`` (in Redis and in ``h``) once its input file
    is gone while some line has not finished. Looked for every INPUT_CHECK_EVERY_S."""
    if h["status"] != "in_progress" or "input_lost_at" in h or len(run.stored) == run.total:
        return
    if not run.input_gone:
        now = time.monotonic()
        if now - run.input_checked_at < INPUT_CHECK_EVERY_S:
            return
        run.input_checked_at = now
        run.input_gone = not store.exists(store_name(h["input_file_id"]))
    if run.input_gone:
        log.warning("batch %s: its input file %s is gone; %d lines will not run", run.id,
                    h["input_file_id"], run.total - len(run.stored) - len(run.jobs))
        h["input_lost_at"] = str(int(time.time()))
        db.set_fields(run.id, input_lost_at=h["input_lost_at"])
