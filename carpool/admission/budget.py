"""Byte budgets: how much queued input one model (and one API key) may keep in Redis.

A bin's ``max_depth`` bounds a count, not bytes: 4,608 images of 8 MiB fill any
Redis. So admit.lua also keeps, per model (and per API key when keys are on), the
bytes of the inputs it admitted that are still queued, and refuses (429) an input
that would take them past the model's ``max_queued_bytes``. A full model then
refuses its own submits while other models' still fit in Redis's ``maxmemory``.

The count is one field, ``"queued"``, of a hash per model (and per model and API
key). Claims and cancels subtract an input's bytes; the hash goes when its count
reaches 0. A queued record has no TTL (claim.lua ends a job queued longer than
``CARPOOL_QUEUED_TTL_S`` "expired", and takes its bytes out then), so an input
leaves the count when it leaves its bin. A bin no worker claims from (nobody serves
the model, or the bin was removed from the catalogue with jobs in it) keeps its
inputs counted, and the model refuses with 429 ``budget_full`` once they fill it,
until a worker claims them or they are cancelled (``DELETE /result/<id>``): drain
a bin before removing it. Inputs of running jobs no longer count: a worker holds at most its
batches' worth. A job that goes back to its bin (a lost lease, a warm shutdown) is
not counted again: the count may run that many inputs low, and never below 0
(the hash goes instead).

At start, ``check_catalogue_memory`` compares the budgets with Redis's
``maxmemory`` (docs/operations.md, "Sizing Redis").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from carpool.core.catalogue import ModelSpec
from carpool.core.errors import ConfigError

log = logging.getLogger(__name__)

#: Bytes Redis spends per queued job beside its input: its record's other fields, the
#: bin zset entry and their overhead (measured ~460 with INFO used_memory over 2,560
#: synthetic jobs; rounded up).
RECORD_OVERHEAD_BYTES = 600
#: A finished job kept for its result_ttl_s: a synthetic record measured ~640 bytes
#: with its key and TTL (status, times, timings, batch, a small result; INFO
#: used_memory over 2,560 jobs); a model's larger results add theirs.
FINISHED_RECORD_BYTES = 700
#: Share of maxmemory the budgets and queued records may take before the check
#: warns: the rest holds finished results, leases, stats and Redis's own overhead.
QUEUED_SHARE = 0.5


def queued_bound_bytes(spec: ModelSpec) -> int:
    """The most memory the model's queued jobs can take: its budget plus per-job records.

    Without a budget, every bin full of the largest inputs.
    """
    depth = sum(b.max_depth for b in spec.bins)
    inputs = spec.max_queued_bytes or depth * spec.max_stored_input_bytes
    return min(inputs, depth * spec.max_stored_input_bytes) + depth * RECORD_OVERHEAD_BYTES


def memory_report(specs: Iterable[ModelSpec], maxmemory_bytes: int) -> tuple[bool, str]:
    """(fits, the arithmetic): do the catalogue's queued bounds fit in ``maxmemory``?"""
    lines, total = [], 0
    for spec in specs:
        bound = queued_bound_bytes(spec)
        total += bound
        lines.append(f"{spec.name} {_mib(bound)}")
    room = maxmemory_bytes - total
    text = (f"queued jobs may take {_mib(total)} ({', '.join(lines)}) of maxmemory "
            f"{_mib(maxmemory_bytes)}")
    if room > 0:
        text += (f"; the {_mib(room)} left hold finished results: at ~{FINISHED_RECORD_BYTES}"
                 f" bytes a record kept result_ttl_s, about {room // FINISHED_RECORD_BYTES:,}"
                 " finished jobs at once")
    return total <= maxmemory_bytes * QUEUED_SHARE, text


def check_catalogue_memory(specs: Iterable[ModelSpec], maxmemory_bytes: int | None, *,
                           require: bool, who: str) -> str:
    """Warn (or with ``require``, refuse) when the budgets do not fit Redis's maxmemory.

    Returns the warning with its arithmetic; "" when the budgets fit (the arithmetic
    is logged at INFO) or Redis has no maxmemory (the durability check warns then).
    """
    if not maxmemory_bytes:
        return ""
    fits, text = memory_report(specs, maxmemory_bytes)
    if fits:
        log.info("%s: %s", who, text)
        return ""
    advice = (f"{text}: over {QUEUED_SHARE:.0%} of it, so a flood can fill Redis and every "
              "model's submits answer 503; lower max_queued_bytes or max_depth in the "
              "catalogue, or raise maxmemory")
    if require:
        raise ConfigError(f"{who}: CARPOOL_REQUIRE_DURABLE=1 and {advice}")
    log.warning("%s: %s", who, advice)
    return advice


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"
