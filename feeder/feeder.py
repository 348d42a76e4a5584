"""The feeder's loop: validate, collect, feed, finish; one step for all bulk batches at once.

Every step starts from what Redis says (carpool/backend/bulkdb.py); a lost
Redis drops the copy in memory, and the next step rebuilds it, so a restart and
a reconnect are the same path (docs/batches.md, "Nothing lost, nothing twice").
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import defaultdict
from typing import Any

from carpool.admission.tiers import TIERS
from carpool.admission.urgency import BULK_PRIORITY
from carpool.backend.admissions import Admissions, AdmitJob, AdmitRequest
from carpool.backend.bulkdb import BulkDb
from carpool.backend.filestore import FileStore, store_name
from carpool.backend.queue import Queue
from carpool.backend.registry import Registry, RegistryCache
from carpool.backend.rollouts import RolloutCache, RolloutStore
from carpool.core.bulk import BulkStatus, BulkView
from carpool.core.errors import BackendUnavailable, ModelRefused, NotCancellable
from carpool.core.jobs import MODEL_UNAVAILABLE, Admitted, JobView, new_job_id
from carpool.core.settings import Settings
from feeder import chunks, intake
from feeder.labels import drop_labels
from feeder.metrics import FeederMetrics
from feeder.run import Ending, Run, ended_line, ending_of, error_line

log = logging.getLogger("carpool.feeder")

#: Lines one API key may admit per round before the next key's turn (fair share).
QUANTUM_LINES = 8
#: Jobs read per round trip when looking for ended lines.
READ_CHUNK = 500
#: How often a batch's projected completion is written back, in seconds.
PROJECT_EVERY_S = 1.0
#: The statuses a batch that failed on its own can leave.
UNENDED = (BulkStatus.VALIDATING, BulkStatus.IN_PROGRESS, BulkStatus.FINALIZING,
           BulkStatus.CANCELLING)
#: Waits after a lost Redis or file store, doubling up to the last.
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)


class Feeder:
    def __init__(self, settings: Settings, queue: Queue, db: BulkDb, store: FileStore) -> None:
        self.settings, self.queue, self.db, self.store = settings, queue, db, store
        self.admissions = Admissions(queue.client, queue.keys,
                                     policies=settings.api_key_policies)
        self.runs: dict[str, Run] = {}
        self.turn = 0  # which API key goes first this round
        self.metrics = FeederMetrics()
        #: What the workers serve: the lines of a model every live worker refused
        #: fail at once, as /submit answers 503 (carpool/backend/registry.py).
        self.models = RegistryCache(Registry(queue.client, queue.keys))
        #: A retiring version's lines not yet admitted fail so too (docs/deployments.md).
        self.rollouts = RolloutCache(RolloutStore(queue.client, queue.keys),
                                     [s.name for s in settings.catalogue if not s.family])

    def step(self) -> bool:
        """One pass over every active batch; True when it did something."""
        active = self.db.active()
        for gone in set(self.runs) - set(active):
            del self.runs[gone]
        busy = False
        feedable: list[Run] = []
        for bulk_id in active:
            view = self.db.bulk(bulk_id)
            if view is None:
                continue
            try:
                busy |= self._step_bulk(bulk_id, view, feedable)
            except BackendUnavailable:
                raise
            except Exception as exc:  # one broken batch must not stop the others
                log.exception("batch %s failed", bulk_id)
                self._fail(bulk_id, f"the feeder could not run this batch: {exc}")
                busy = True
        return self._feed(feedable) or busy

    def _step_bulk(self, bulk_id: str, view: BulkView, feedable: list[Run]) -> bool:
        if view.status is BulkStatus.VALIDATING:
            intake.validate(self.settings, self.db, self.store, self.metrics, view)
            return True
        if view.status is BulkStatus.FINALIZING:
            self._finalize(self.runs.get(bulk_id) or self._load(view), view.status)
            return True
        run = self.runs.get(bulk_id)
        if run is None:
            run = self.runs[bulk_id] = self._load(view)
        view = intake.watch(self.db, self.store, run, view)
        run.ending = ending_of(view.status, view.input_lost_at is not None,
                               time.time() >= run.expires_at, view.input_file_id)
        busy = self._collect(run)
        busy |= self._wind_down(run, view.status)
        if run.ending is None and run.lines and bulk_id in self.runs:
            feedable.append(run)
        return busy

    def _fail(self, bulk_id: str, message: str) -> None:
        """End a batch ``failed`` for a reason of its own (it cannot be run at all)."""
        self.runs.pop(bulk_id, None)
        error = {"code": "internal_error", "message": message[:500], "param": None,
                 "line": None}
        if self.db.move(bulk_id, UNENDED, BulkStatus.FAILED, failed_at=int(time.time()),
                        errors=json.dumps({"object": "list", "data": [error]})):
            self.metrics.ended.labels("failed").inc()

    def _load(self, view: BulkView) -> Run:
        return intake.load(self.settings, self.db, self.store, view)

    # --- collecting ---
    def _collect(self, run: Run) -> bool:
        lines = sorted(run.jobs)
        ids = [j for i in lines for j in run.jobs[i]]
        views: dict[str, JobView | None] = {}
        for start in range(0, len(ids), READ_CHUNK):
            part = ids[start:start + READ_CHUNK]
            views.update(zip(part, self.queue.get_many(part), strict=True))
        out: list[tuple[int, str]] = []
        err: list[tuple[int, str]] = []
        lost: list[int] = []
        for i in lines:
            got = [views[j] for j in run.jobs[i]]
            if any(v is None for v in got):
                lost.append(i)  # its result expired unstored, or Redis lost it: again
            elif all(v is not None and v.status.is_final for v in got):
                ok, text = ended_line(run, i, [v for v in got if v is not None])
                (out if ok else err).append((i, text))
        if lost:
            log.warning("batch %s: %d lines lost their jobs; admitting them again",
                        run.id, len(lost))
            self.db.forget_admitted(run.id, lost)
            for i in lost:
                del run.jobs[i]
            run.next = min([run.next, *lost])
        if out or err:
            self._store(run, out, err)
        return bool(out or err or lost)

    def _store(self, run: Run, out: list[tuple[int, str]], err: list[tuple[int, str]]) -> None:
        done = [i for i, _ in out + err]
        chunks.write_chunk(self.store, run.id, run.chunks, out, err)
        ended = [j for i in done for j in run.jobs.get(i, [])]

        def drop_jobs(pipe: Any) -> None:  # the results, now stored, leave Redis
            for j in ended:
                pipe.delete(self.queue.keys.job(j))

        self.db.record_stored(run.id, done, run.chunks, len(out), len(err), drop_jobs)
        self.metrics.stored.labels("done").inc(len(out))
        self.metrics.stored.labels("failed").inc(len(err))
        run.chunks += 1
        for i in done:
            run.jobs.pop(i, None)
            run.stored.add(i)
        run.advance()
        self._project(run)

    def _project(self, run: Run) -> None:
        now = time.monotonic()
        then, count = run.sampled
        if now - then < PROJECT_EVERY_S:
            return
        rate = (len(run.stored) - count) / (now - then)
        run.rate_per_s = rate if run.rate_per_s == 0 else 0.7 * run.rate_per_s + 0.3 * rate
        run.sampled = (now, len(run.stored))
        left = run.total - len(run.stored)
        if run.rate_per_s > 0:
            at = time.time() + left / run.rate_per_s
            self.db.set_fields(run.id, projected_at=int(at),
                               at_risk=int(at > run.expires_at))

    # --- ending ---
    def _wind_down(self, run: Run, status: BulkStatus) -> bool:
        """A running batch with every line stored goes to ``finalizing``; one with an
        ending (cancelled, expired, input lost) withdraws its queued jobs, waits for the
        running ones, errors every other line with the ending's reason and ends."""
        ending = run.ending
        if ending is None:
            if status is BulkStatus.IN_PROGRESS and len(run.stored) == run.total:
                self.db.move(run.id, (BulkStatus.IN_PROGRESS,), BulkStatus.FINALIZING,
                             finalizing_at=int(time.time()))
                return True
            return False
        for job_id in [j for ids in run.jobs.values() for j in ids]:
            view = self.queue.get(job_id)
            if view is not None and view.status.value == "queued":
                try:
                    self.queue.cancel(job_id, self.settings.catalogue.result_ttl_s(run.spec.name))
                except NotCancellable:
                    pass  # claimed meanwhile: it ends on its own
        if run.jobs:
            return True  # wait for the running ones
        rest = [i for i in run.unstored if i not in run.jobs]
        if rest:
            self._store(run, [], [(i, error_line(run, i, ending.code, ending.message))
                                  for i in rest])
        self._finalize(run, status, ending)
        return True

    def _finalize(self, run: Run, status: BulkStatus, ending: Ending | None = None) -> None:
        """Make the output and error files from the recorded chunks; then the end status
        (``completed``, or the ending's). Repeatable: the file ids follow from the
        batch's id."""
        names: dict[str, str] = {}
        final = ending.final if ending is not None else BulkStatus.COMPLETED
        if ending is not None and ending.bulk_error:
            names["errors"] = json.dumps({"object": "list", "data": [{
                "code": ending.code, "message": ending.bulk_error,
                "param": "input_file_id", "line": None}]})
        for part, kind in (("out", "output"), ("err", "error")):
            file_id = "file-" + hashlib.sha256(f"{run.id}\0{kind}".encode()).hexdigest()[:24]
            # Made by a finalize cut short after it, whose chunks may be gone: kept whole.
            # Asked of Redis, not the store: without s3:ListBucket a missing object
            # answers 403, not 404.
            if self.db.file(file_id) is None:
                data = chunks.assemble(self.store, run.id, run.chunks, part)
                if not data:
                    continue
                self.store.put(store_name(file_id), data)
                self.db.add_file({"id": file_id, "bytes": len(data),
                                  "created_at": int(time.time()),
                                  "filename": f"{run.id}_{kind}.jsonl",
                                  "purpose": "batch_output", "owner": run.owner},
                                 self.settings.bulk.keep_s)
            names[f"{kind}_file_id"] = file_id
        # Dropped before the end: no step comes back to a final batch, so a crash or a
        # store error after it would leave them in the store for good.
        chunks.drop_chunks(self.store, run.id, run.chunks)
        drop_labels(self.store, run.id)
        now = int(time.time())
        moved = self.db.move(run.id, (status,), final, **names, **{f"{final.value}_at": now})
        if moved:
            self.metrics.ended.labels(final.value).inc()
            self.db.drop_line_state(run.id, self.settings.bulk.keep_s)
            self.runs.pop(run.id, None)

    # --- feeding ---
    def _feed(self, runs: list[Run]) -> bool:
        """Admit lines where their bins have room, API keys taking turns."""
        cap = self.settings.bulk.queued_batches_per_bin
        room: dict[tuple[str, str], int] = {}
        for run in runs:
            for b in run.spec.bins:
                room.setdefault((run.spec.name, b.name), cap * b.max_batch)
        for run in self.runs.values():
            if not run.lines:
                continue  # its input is gone: its jobs' bins are unknown; it admits none
            for i in run.jobs:
                for job in run.lines[i].jobs:
                    room[(run.spec.name, job.bin.name)] = room.get(
                        (run.spec.name, job.bin.name), 0) - 1
        by_owner: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            by_owner[run.owner].append(run)
        owners = sorted(by_owner)
        if not owners:
            return False
        self.turn = (self.turn + 1) % len(owners)
        owners = owners[self.turn:] + owners[:self.turn]
        closed: dict[tuple[str, str], int] = {}
        fed_any, progress = False, True
        while progress:
            progress = False
            for owner in owners:
                n = 0
                for run in by_owner[owner]:
                    n += self._feed_run(run, room, closed, QUANTUM_LINES - n)
                    if n >= QUANTUM_LINES:
                        break
                progress |= n > 0
            fed_any |= progress
        return fed_any

    def _feed_run(self, run: Run, room: dict[tuple[str, str], int],
                  closed: dict[tuple[str, str], int], most: int) -> int:
        """Admit up to ``most`` of the run's lines where ``room`` is left in their bins
        and no line of the run's tier or a higher one was refused this step (``closed``:
        each bin's highest tier refused, as an index of TIERS)."""
        rank = TIERS.index(run.tier)

        def shut(k: tuple[str, str]) -> bool:
            return room.get(k, 0) <= 0 or closed.get(k, -1) >= rank

        try:
            self.models.check(run.spec.name)
            self.rollouts.get(run.spec.base_name).check_open(run.spec)
        except ModelRefused as refused:  # the scan window's lines end, not admitted
            lines = list(run.waiting())
            if lines:
                self._store(run, [], [(i, error_line(run, i, MODEL_UNAVAILABLE, str(refused)))
                                      for i in lines])
            return len(lines)
        admitted: dict[int, list[str]] = {}
        bins = [(run.spec.name, b.name) for b in run.spec.bins]
        for i in run.waiting():
            if len(admitted) >= most or all(shut(k) for k in bins):
                break
            line = run.lines[i]
            keys = [(run.spec.name, job.bin.name) for job in line.jobs]
            if any(shut(k) for k in keys):
                continue
            ids = self._admit_line(run, i)
            if ids is None:
                # Refused (its tier's part full, over budget): that bin waits a step for
                # this tier and those below it; a higher tier's larger part may have room.
                for k in keys:
                    closed[k] = max(closed.get(k, -1), rank)
                continue
            for k in keys:
                room[k] -= 1
            admitted[i] = ids
        if admitted:
            self.db.record_admitted(run.id, admitted)
            self.metrics.admitted.inc(len(admitted))
            run.jobs.update(admitted)
            run.advance()
        return len(admitted)

    def _admit_line(self, run: Run, i: int) -> list[str] | None:
        ids = []
        window_ms = max(1, int((run.expires_at - time.time()) * 1000))
        for k, job in enumerate(run.lines[i].jobs):
            request = AdmitRequest(
                run.spec, (AdmitJob(job.bin, new_job_id(run.spec.name), job.input_json),),
                self.settings.queued_ttl_s, deadline_ms=window_ms, priority=BULK_PRIORITY,
                owner=run.owner,
                owner_weight=self.settings.api_key_weights.get(run.owner, 1.0),
                idempotency_digest=run.idempotency(i, k),
                input_digest=hashlib.sha256(job.input_json.encode()).hexdigest(), tier=run.tier)
            (outcome,) = self.admissions.admit(request)
            if not isinstance(outcome, Admitted):
                if isinstance(outcome, BackendUnavailable):
                    raise outcome
                return None
            ids.append(outcome.id)
        return ids


def run_forever(feeder: Feeder, stop: threading.Event, wake: Any) -> None:
    """Steps until ``stop``; between idle steps it waits for a job to end (``wake``, a
    pub/sub of the done channel) or a short while; a lost Redis backs off."""
    failures = 0
    while not stop.is_set():
        try:
            with feeder.metrics.step_seconds.time():
                busy = feeder.step()
            feeder.metrics.running.set(len(feeder.runs))
            failures = 0
        except BackendUnavailable as exc:
            log.warning("feeder: %s; retrying", exc)
            feeder.runs.clear()  # rebuilt from Redis, which may have lost its last writes
            stop.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
            failures += 1
            continue
        if not busy:
            wake(stop)
