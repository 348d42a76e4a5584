"""web/common/refusals.py: one row per refusal, read by both the error answers and the metrics.

Every refusal admit.lua's reply can give (carpool/admission/admit_reply.py) has a row
of its own, not only its base class's: a 429 of a new kind would otherwise answer
and count as the generic ``bin_full``."""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

import pytest
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from carpool.admission.admit_reply import admit_outcomes
from carpool.core.catalogue import builtin_models
from carpool.core.errors import (
    BackendUnavailable,
    CarpoolError,
    ConfigError,
    IdempotencyConflict,
    ModelUnloaded,
    NotSent,
)
from carpool.core.jobs import Admitted
from web.common.errors import status_and_code
from web.common.metrics import rejection_reason
from web.common.refusals import INTERNAL, REASONS, REFUSALS, Refusal, refusal_of

#: A reply of each refusing kind, as admit.lua returns it (none of its jobs admitted).
REFUSING_REPLIES: dict[str, list[Any]] = {
    "full": ["full", 0, 5, "0.5", 1000],
    "share": ["share", 0, 5, "0.5", 1000, 2.0],
    "late": ["late", 0, 5, 3, 1.5, 1000],
    "over": ["over", 0, 5, "model", 10, 20],
    "quota": ["quota", 0, 5, "jobs", "0", 2.0, "0.5"],
}
#: admit.lua's answers that are not a refusal of the job: admitted, or an idempotent
#: repeat (carpool/backend/admissions.py reads those two itself).
NOT_REFUSALS = {"ok", "dup", "conflict"}
#: The refusal of an unloaded model (the repository API): not a 429 to retry, but the
#: 503 of a model that no worker serves.
UNLOADED_REPLY = ["unloaded", 0, 5]


def reply_kinds() -> set[str]:
    source = files("carpool.backend").joinpath("lua", "admit.lua").read_text()
    # A refusal goes back through refused(...), which counts it (lib/usage.lua).
    return set(re.findall(r'(?:return |refused\()\{"(\w+)"', source))


def test_every_kind_admit_lua_answers_is_known_here() -> None:
    assert reply_kinds() == set(REFUSING_REPLIES) | NOT_REFUSALS | {UNLOADED_REPLY[0]}


@pytest.mark.parametrize("kind", sorted(REFUSING_REPLIES))
def test_every_refusal_of_an_admit_reply_has_a_row_of_its_own(kind: str) -> None:
    spec = builtin_models()["synthetic"]
    (refused,) = admit_outcomes(spec, spec.bins[0], ["j"], REFUSING_REPLIES[kind])
    assert not isinstance(refused, Admitted)
    assert refusal_of(refused).error is type(refused)
    assert refusal_of(refused).status == 429


def test_an_unloaded_models_refusal_answers_503_model_unavailable() -> None:
    spec = builtin_models()["synthetic"]
    (refused,) = admit_outcomes(spec, spec.bins[0], ["j"], UNLOADED_REPLY)
    assert isinstance(refused, ModelUnloaded)
    assert status_and_code(refused) == (503, "model_unavailable")


@pytest.mark.parametrize("cls", [IdempotencyConflict, BackendUnavailable])
def test_the_other_admission_outcomes_have_rows(cls: type[CarpoolError]) -> None:
    assert refusal_of(cls("x")).error is cls
    assert refusal_of(NotSent("x")).error is BackendUnavailable  # a 503 like its base


@pytest.mark.parametrize("row", REFUSALS, ids=lambda r: r.code)
def test_the_answer_and_the_metric_read_the_same_row(row: Refusal) -> None:
    exc = row.error.__new__(row.error)  # isinstance is all the table looks at
    assert refusal_of(exc) is row  # no earlier row shadows it
    assert status_and_code(exc) == (row.status, row.code)
    assert rejection_reason(exc) == row.reason
    assert row.reason in REASONS


def test_what_no_row_names_is_the_servers_fault_and_werkzeugs_own_keep_their_reasons() -> None:
    assert status_and_code(ConfigError("x")) == (500, "internal_error")
    assert rejection_reason(ConfigError("x")) == INTERNAL.reason == "error"
    assert rejection_reason(RequestEntityTooLarge()) == "too_large"
    assert rejection_reason(BadRequest()) == "invalid"
    assert rejection_reason(ValueError()) == "error"
    assert set(REASONS) == {"wait_too_long", "over_share", "quota_exceeded", "bin_full",
                            "budget_full",
                            "unavailable", "unknown_model", "too_large", "conflict",
                            "invalid", "error"}
