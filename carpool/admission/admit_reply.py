"""admit.lua's reply, job by job: which jobs of a call were queued, and why the rest not.

One call judges its jobs in order and stops at the first it refuses; every later
job of the call is refused for the same reason (carpool/backend/lua/admit.lua's header).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from carpool.admission.retry_after import (
    drain_rate_per_s,
    late_retry_after_s,
    retry_after_s,
    share_retry_after_s,
)
from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import (
    BinFull,
    BudgetFull,
    ModelUnloaded,
    OverShare,
    QuotaExceeded,
    WaitTooLong,
)
from carpool.core.jobs import Admitted

#: What admit.lua answers a job it did not queue.
Refused = BinFull | BudgetFull | ModelUnloaded


def admit_outcomes(
    model: ModelSpec, bin_spec: BinSpec, ids: Sequence[str], reply: Sequence[Any]
) -> list[Admitted | Refused]:
    """Per id, from admit.lua's reply: the first ``admitted`` were queued, the rest are
    refused for the reason the reply names (the first refused job's)."""
    kind, admitted, depth = reply[0], int(reply[1]), int(reply[2])
    out: list[Admitted | Refused] = [
        Admitted(job_id, model.name, bin_spec.name, depth) for job_id in ids[:admitted]]
    if kind == "ok":
        return out
    refused: Refused
    if kind == "unloaded":  # the repository API (lua/model_state.lua)
        refused = ModelUnloaded(model.name)
    elif kind == "over":  # the byte budget (carpool/admission/budget.py): model's or API key's
        refused = BudgetFull(model.name, str(reply[3]), int(reply[4]), int(reply[5]))
    elif kind == "late":
        ahead, rate, limit_ms = int(reply[3]), float(reply[4]), int(reply[5])
        refused = WaitTooLong(
            model.name, bin_spec.name, ahead, ahead / rate * 1000.0 if rate > 0 else math.inf,
            limit_ms, late_retry_after_s(ahead, rate, limit_ms))
    elif kind == "quota":  # the owner's quota (lib/quota.lua): device time or jobs/s
        refused = QuotaExceeded(model.name, bin_spec.name, str(reply[3]), float(reply[4]),
                                float(reply[5]), float(reply[6]))
    elif kind == "share":
        refused = OverShare(model.name, bin_spec.name, depth, share_retry_after_s(
            float(reply[5]), drain_rate_per_s(float(reply[3]), int(reply[4]))))
    else:
        wait_s = retry_after_s(depth, drain_rate_per_s(float(reply[3]), int(reply[4])))
        # Below max_depth: the part of the bin its service tier may fill is full.
        tiered = "" if depth >= bin_spec.max_depth else (
            f"bin {bin_spec.name!r} of model {model.name!r} holds {depth} jobs, all this "
            f"service tier may fill (the rest is kept for higher tiers); retry after "
            f"{wait_s:.0f} s")
        refused = BinFull(model.name, bin_spec.name, depth, wait_s, tiered)
    return out + [refused] * (len(ids) - admitted)
