"""A rollout's rules, no Redis: where a job that names no version goes for a draw, which
changes a PUT body may make (and the 400s and 409s of the rest), what a rollback
keeps, and when a shadow's result agrees with the served one."""

from __future__ import annotations

import math
from typing import Any

import pytest

from carpool.core.errors import InvalidInput
from carpool.core.rollouts import Rollout, RolloutConflict, agrees, change, rolled_back

VERSIONS = ["1", "2", "3"]
NOW_MS = 1_000_000


def put(body: Any, current: Rollout | None = None) -> Rollout:
    return change(current or Rollout(), body, VERSIONS, "1", NOW_MS)


def test_a_job_naming_no_version_goes_to_the_rollout_below_its_percent() -> None:
    half = Rollout(version="2", percent=50.0)
    assert [half.route("1", d) for d in (0.0, 49.99, 50.0, 99.99)] == ["2", "2", "1", "1"]
    assert Rollout(version="2", percent=0.0).route("1", 0.0) == "1"
    assert Rollout(version="2", percent=100.0).route("1", 99.999) == "2"
    assert Rollout().route("1", 0.0) == "1"


def test_a_shadow_copies_below_its_percent_and_never_its_own_versions_jobs() -> None:
    shadow = Rollout(shadow="3", shadow_percent=25.0)
    assert [shadow.copies("1", d) for d in (0.0, 24.9, 25.0)] == [True, True, False]
    assert shadow.copies("2", 0.0) and not shadow.copies("3", 0.0)
    assert not Rollout().copies("1", 0.0)


def test_a_put_changes_one_thing_and_keeps_the_rest() -> None:
    state = put({"version": "2", "percent": 10})
    assert (state.version, state.percent) == ("2", 10.0)
    state = put({"shadow": "3", "percent": 12.5}, state)
    assert (state.version, state.percent, state.shadow, state.shadow_percent) == (
        "2", 10.0, "3", 12.5)
    state = put({"version": "2", "percent": 100}, state)
    retired = put({"retire": "1"}, state)
    assert retired.retiring == {"1": NOW_MS} and retired.shadow == "3"
    again = change(retired, {"retire": "1"}, VERSIONS, "1", NOW_MS + 5)
    assert again.retiring == {"1": NOW_MS}  # retired once: its drain counts from then


@pytest.mark.parametrize("body, message", [
    ([], "must be a JSON object"),
    ({}, "one change per request"),
    ({"version": "2", "shadow": "3", "percent": 1}, "one change per request"),
    ({"retire": "2", "percent": 5}, "one change per request"),
    ({"version": "2", "percent": 5, "extra": 1}, "one change per request"),
    ({"version": "9", "percent": 5}, "no version \"9\"; the model's versions: 1, 2, 3"),
    ({"version": 2, "percent": 5}, "no version 2"),
    ({"version": "2"}, "needs 'percent', a number from 0 to 100"),
    ({"version": "2", "percent": 101}, "not 101"),
    ({"version": "2", "percent": -1}, "not -1"),
    ({"version": "2", "percent": "50"}, "not \"50\""),
    ({"version": "2", "percent": True}, "not true"),
    ({"version": "2", "percent": math.nan}, "from 0 to 100"),
    ({"version": "1", "percent": 50}, "the model's own entry"),
    ({"shadow": "1", "percent": 50}, "a shadow must be another version"),
])
def test_a_malformed_change_is_a_400_that_says_what_to_send(body: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as found:
        put(body)
    assert message in str(found.value)


def test_the_served_version_and_the_shadow_are_never_the_same() -> None:
    state = put({"version": "2", "percent": 50})
    with pytest.raises(InvalidInput, match="a shadow must be another version"):
        put({"shadow": "2", "percent": 5}, state)
    state = put({"shadow": "3", "percent": 5}, state)
    with pytest.raises(InvalidInput, match="is the shadow"):
        put({"version": "3", "percent": 5}, state)


def test_retiring_a_version_jobs_still_go_to_is_a_409() -> None:
    with pytest.raises(RolloutConflict, match="PUT a rollout at percent 100 first"):
        put({"retire": "1"}, put({"version": "2", "percent": 99}))
    with pytest.raises(RolloutConflict, match="PUT its percent to 0 first"):
        put({"retire": "2"}, put({"version": "2", "percent": 1}))
    with pytest.raises(RolloutConflict, match="is the shadow"):
        put({"retire": "3"}, put({"shadow": "3", "percent": 1}))
    retiring = put({"retire": "3"})
    with pytest.raises(RolloutConflict, match="is retiring"):
        put({"shadow": "3", "percent": 1}, retiring)
    assert put({"retire": "2"}, put({"version": "2", "percent": 0})).retiring == {"2": NOW_MS}
    own_retiring = put({"retire": "1"}, put({"version": "2", "percent": 100}))
    with pytest.raises(RolloutConflict, match="must all go to the rollout"):
        put({"version": "2", "percent": 99}, own_retiring)
    assert put({"version": "3", "percent": 100}, own_retiring).version == "3"


def test_routing_to_a_retiring_version_reopens_it() -> None:
    state = put({"version": "2", "percent": 50}, put({"retire": "2"}))
    assert state.retiring == {} and state.version == "2"


def test_a_rollback_sends_every_job_home_and_reopens_only_the_entrys_own_version() -> None:
    state = Rollout(version="2", percent=100.0, shadow="3", shadow_percent=5.0,
                    retiring={"1": 5, "0": 4})
    assert rolled_back(state, "1") == Rollout(retiring={"0": 4})
    assert rolled_back(Rollout(version="2", percent=10.0), "1").is_empty()


def test_embeddings_agree_by_cosine_at_the_bound() -> None:
    a = {"embedding": [1.0, 0.0], "tokens": 3}
    near = {"embedding": [0.995, math.sqrt(1 - 0.995**2)], "tokens": 9}
    far = {"embedding": [0.9, math.sqrt(1 - 0.81)]}
    assert agrees("text", a, a) and agrees("hashembed", a, near)
    assert not agrees("text", a, far)
    assert agrees("text", a, far, cosine_min=0.85)
    assert not agrees("hashembed", a, {"embedding": [1.0, 0.0, 0.0]})  # another width
    assert not agrees("text", a, {"error": "x"})


def test_classifications_agree_by_their_top_1_and_the_rest_when_equal() -> None:
    cat = {"top_k": [{"index": 3, "label": "cat", "score": 0.9}, {"index": 1, "score": 0.1}]}
    cat2 = {"top_k": [{"index": 3, "label": "cat", "score": 0.6}, {"index": 2, "score": 0.3}]}
    dog = {"top_k": [{"index": 4, "label": "dog", "score": 0.5}]}
    assert agrees("image", cat, cat2) and not agrees("image", cat, dog)
    assert not agrees("image", cat, {"echo": 1})
    assert agrees("synthetic", {"echo": 1, "checksum": "a"}, {"echo": 1, "checksum": "a"})
    assert not agrees("synthetic", {"echo": 1}, {"echo": 2})
