"""Where a job sorts in its bin: one number, its *urgency*, smaller first.

    urgency = admission + deadline − priority × priority_step_ms        (ms)

where *deadline* is the job's own ``deadline_ms``, else the model's
``default_deadline_ms``, else — for a job that never expires — the model's
``max_deadline_ms`` (the laxest deadline it allows). So within a bin:

- jobs go earliest-deadline-first, and equal deadlines stay first-in, first-out
  (the admission time breaks the tie, to the microsecond);
- priority is 0..9 (default 0); each level moves a job ``priority_step_ms``
  ahead (1 s unless the catalogue says otherwise). A higher level therefore goes
  before every lower-level job admitted less than ``(difference) × step`` before
  it — in practice, always — and a job of level 0 is overtaken by later arrivals
  for at most ``9 × step``: its wait is bounded (docs/scheduling.md);
- a job without a deadline sorts behind every job that has one of the same age.

admit.lua adds Redis's clock (µs) to the offset computed here and stores the
result as the job's score in the bin's sorted set and in its record (``score``),
so a job returned to its bin (a lost lease) sorts back into its own place.
"""

from __future__ import annotations

from carpool.core.catalogue import ModelSpec

#: Priorities a client may send; higher goes first.
MIN_PRIORITY, MAX_PRIORITY = 0, 9
#: The level of a bulk batch's lines (docs/batches.md), below every client's: such a
#: job sorts behind every interactive job admitted up to BULK_BEHIND_MS after it,
#: whatever that job's deadline and priority.
BULK_PRIORITY = -1
BULK_BEHIND_MS = 3_600_000


def effective_deadline_ms(spec: ModelSpec, requested_ms: int) -> int:
    """The job's relative deadline: its own (0: none asked), else the model's default."""
    return requested_ms if requested_ms > 0 else spec.default_deadline_ms


def sort_offset_ms(spec: ModelSpec, deadline_ms: int, priority: int) -> int:
    """Urgency minus admission time, for a job whose effective deadline is ``deadline_ms``."""
    horizon_ms = deadline_ms if deadline_ms > 0 else spec.max_deadline_ms
    if priority == BULK_PRIORITY:
        # Later than the laxest interactive job's place (max_deadline_ms, level 0),
        # by BULK_BEHIND_MS; a bulk line's own deadline (its window) still ends it.
        return max(horizon_ms, spec.max_deadline_ms) + BULK_BEHIND_MS
    return horizon_ms - priority * spec.priority_step_ms


def score_us(admit_us: int, offset_ms: int) -> int:
    """The bin score of a job admitted at ``admit_us`` (µs), as admit.lua computes it."""
    return admit_us + offset_ms * 1000
