"""The queue scripts' replies as typed values, and complete.lua's per-job arguments:
the parsing and building that carpool/backend/queue.py's methods share."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from carpool.admission.urgency import MIN_PRIORITY
from carpool.backend import records
from carpool.backend.pushed import job_blob
from carpool.core.jobs import BinState, Claim, ClaimedJob, Outcome, with_result_json
from carpool.core.wire import (
    CompletionHook,
    HookField,
    UsageLine,
    encode_completion_hooks,
    encode_usage,
)


@dataclass(frozen=True)
class Completed:
    """What ``Queue.complete`` answers: per job, written or refused; and, when bins were
    peeked, Redis time (ms) and their states, as ``Queue.peek`` returns them."""

    written: list[bool]
    now_ms: int = 0
    states: list[BinState] | None = None


def claimed_job(job_id: str, record: str, now_ms: int) -> ClaimedJob:
    """A job as claim.lua hands it out: its id and its queued record, whole. This claim
    is one more run: claim.lua counted it in the claim hash the same way."""
    attempts, admission, input_json = records.claimed(record)
    t_admit_ms, owner = records.admission_fields(admission)
    return ClaimedJob(job_id, input_json, now_ms if t_admit_ms is None else t_admit_ms,
                      attempts + 1, owner, admission)


def claim_reply(model: str, bin_name: str, token: str, reply: Sequence[Any]) -> Claim:
    """claim.lua's answer, ``now_ms, expired, id, record, id, record, ...``, as a Claim."""
    now_ms = int(reply[0])
    jobs = tuple(claimed_job(str(reply[i]), str(reply[i + 1]), now_ms)
                 for i in range(2, len(reply), 2))
    return Claim(model, bin_name, token, now_ms, jobs, expired=int(reply[1]))


def bin_states(model: str, bins: Sequence[str], reply: Sequence[Any]) -> list[BinState]:
    """peek_bins.lua's four numbers per bin, as ``BinState``s."""
    states = []
    for k, bin_name in enumerate(bins):
        depth, oldest, earliest, admitted = (int(x) for x in reply[4 * k: 4 * k + 4])
        states.append(BinState(model, bin_name, depth, oldest if oldest >= 0 else None,
                               earliest if earliest > 0 else None, admitted))
    return states


def completion_args(model: str, claim: Claim, outcomes: Sequence[Outcome],
                    batch_json: str) -> tuple[list[Any], str, str, str]:
    """complete.lua's ``per_job`` run (4 values per outcome), its ``pushed`` views, one
    argument (the script keeps it whole), its ``hooks``: the webhook events of the
    jobs that asked for their outcome's, and its ``usage``: what the jobs cost, per
    owner (a job's ``device_ms`` rounded to µs, its queue time: admission to claim)."""
    per_job: list[Any] = []
    usage: dict[str, list[tuple[int, int, int]]] = {}
    lines: list[str] = []
    hooks: list[CompletionHook] = []
    claimed = {j.id: j for j in claim.jobs}
    strangers = [o.id for o in outcomes if o.id not in claimed]
    if strangers:  # complete.lua writes a record from what its claim handed out
        raise ValueError(f"outcomes for jobs this claim does not hold: {strangers[:3]}")
    for o in map(with_result_json, outcomes):  # a result JSON cannot carry fails its job
        device_us = round(o.device_ms * 1000)
        timings = json.dumps({"preprocess": round(o.preprocess_ms, 3),
                              "inference": round(o.inference_ms, 3),
                              "device": device_us / 1000})
        payload = (o.error or "") if o.failed else (o.result_json or "")
        job = claimed[o.id]
        hook = records.admission_hook(job.admission)
        # A job with a webhook is not pushed: its reads show the delivery's state, which
        # only Redis has (carpool/backend/outbox.py).
        blob = "" if hook else job_blob(job, claim.now_ms, o, payload, timings, model)
        event = "failed" if o.failed else "done"
        asked = HookField.decode(hook)
        if asked is not None and asked.wants(event):
            hooks.append(CompletionHook(len(per_job) // 4 + 1, event, job.owner, hook))
        if blob:
            lines.append(blob)
        # The ended record, built from what the claim answered (complete.lua adds
        # t_done): the script writes it without reading the queued one.
        head, tail = ("", "")
        if job.admission:
            head, tail = records.ended_parts("failed" if o.failed else "done",
                                             job.attempts, job.admission, claim.now_ms,
                                             timings, batch_json, payload)
            usage.setdefault(job.owner, []).append(
                (len(per_job) // 4 + 1, device_us, max(0, claim.now_ms - job.admit_ms)))
        per_job += [o.id, len(blob.encode()), head, tail]
    return (per_job, "\n".join(lines), encode_completion_hooks(hooks),
            encode_usage(UsageLine(owner, tuple(jobs)) for owner, jobs in usage.items()))


#: admit.lua's DEADLINE_SHARE: a job with a deadline is admitted only while its
#: predicted end comes within this share of the time to its deadline.
ADMITTED_END_SHARE = 0.7


def started_late(claim: Claim, max_queue_ms: int, ran_ms: int = 0) -> int:
    """The claim's jobs that were late: with a deadline, those whose batch ended after
    it (claimed at ``claim.now_ms``, run ``ran_ms``) or that started past the end their
    admission allowed (``_started_past_admitted_end``); without one, those
    queued longer than ``max_queue_ms`` (0: no bound); and those the claim expired.
    Each is a job the admission's predicted wait let in too early: complete.lua counts
    them (late_c), and admit.lua slows its pace by the part of the model's jobs they are."""
    late = claim.expired
    for job in claim.jobs:
        deadline_ms = records.admission_deadline_ms(job.admission)
        if deadline_ms is not None:
            late += claim.now_ms + ran_ms > deadline_ms or _started_past_admitted_end(
                job, deadline_ms, claim.now_ms)
        elif max_queue_ms > 0:
            late += claim.now_ms > job.admit_ms + max_queue_ms
    return late


def _started_past_admitted_end(job: ClaimedJob, deadline_ms: int, now_ms: int) -> bool:
    """A first run of an interactive job that starts past the end its admission allowed
    (``ADMITTED_END_SHARE`` of the way to its deadline): the prediction was wrong by a
    batch or more, and the pace learns it now, a deadline's slack sooner than the
    deadline would say. Not a bulk line (it waits behind interactive work by design) nor
    a job run again (its wait holds the lease it lost)."""
    if job.attempts != 1 or records.admission_priority(job.admission) < MIN_PRIORITY:
        return False
    return now_ms > job.admit_ms + ADMITTED_END_SHARE * (deadline_ms - job.admit_ms)
