"""Where a job sorts in its bin: deadlines, FIFO ties, priorities, no deadline."""

from dataclasses import replace

import pytest

from carpool.admission.urgency import effective_deadline_ms, score_us, sort_offset_ms
from carpool.core.catalogue import Catalogue, load_catalogue
from carpool.core.errors import InvalidInput
from carpool.core.input_limits import InputLimits
from carpool.intake.inputs import submission_from_json

SPEC = replace(load_catalogue(None).get("synthetic"), max_deadline_ms=60_000,
               priority_step_ms=1000)


def score(admit_ms: int, deadline_ms: int = 0, priority: int = 0) -> int:
    return score_us(admit_ms * 1000, sort_offset_ms(SPEC, deadline_ms, priority))


def test_an_earlier_deadline_sorts_first_and_equal_deadlines_stay_fifo() -> None:
    assert score(1000, deadline_ms=500) < score(900, deadline_ms=700)
    assert score(1000, deadline_ms=500) < score(1001, deadline_ms=500)


def test_a_higher_priority_goes_before_a_lower_one_admitted_up_to_a_step_earlier() -> None:
    assert score(1000, priority=1) < score(1, priority=0)
    assert score(2000, priority=1) > score(999, priority=0)  # the lower level's bound


def test_a_job_without_a_deadline_sorts_as_if_it_had_the_longest_allowed() -> None:
    assert score(1000) == score(1000, deadline_ms=60_000)
    assert score(1000, deadline_ms=59_999) < score(1000)


def test_the_models_default_deadline_applies_when_none_is_asked() -> None:
    spec = replace(SPEC, default_deadline_ms=5000)
    assert effective_deadline_ms(spec, 0) == 5000
    assert effective_deadline_ms(spec, 200) == 200
    assert effective_deadline_ms(SPEC, 0) == 0


@pytest.mark.parametrize("deadline_ms,priority", [(60_001, 0), (100, 10), (100, -1)])
def test_deadlines_over_the_maximum_and_unknown_priorities_are_refused(
        deadline_ms: int, priority: int) -> None:
    # The web checks both where it reads them (carpool/intake/inputs.py), before anything is queued.
    doc = {"model": SPEC.name, "input": {"value": 1, "size": 1}, "deadline_ms": deadline_ms,
           "priority": priority}
    with pytest.raises(InvalidInput):
        submission_from_json(doc, Catalogue({SPEC.name: SPEC}), InputLimits(), None)


def test_a_batch_line_sorts_behind_every_interactive_level_and_deadline() -> None:
    from dataclasses import replace

    from carpool.admission.urgency import (
        BULK_BEHIND_MS,
        BULK_PRIORITY,
        MAX_PRIORITY,
        MIN_PRIORITY,
        sort_offset_ms,
    )
    from carpool.core.catalogue import load_catalogue

    spec = load_catalogue(None).get("synthetic")
    for s in (spec, replace(spec, priority_step_ms=0, max_deadline_ms=1000)):
        batch = sort_offset_ms(s, 60_000, BULK_PRIORITY)
        laxest = max(sort_offset_ms(s, d, p) for d in (0, 1, s.max_deadline_ms)
                     for p in (MIN_PRIORITY, MAX_PRIORITY))
        assert batch >= laxest + BULK_BEHIND_MS
