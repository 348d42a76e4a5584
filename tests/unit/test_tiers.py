"""Service tiers: a request may ask for its key's tier or a lower one, never a higher
or an unknown one; default reserves room only where priority keys exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.admission.tiers import request_tier, tier_shares
from carpool.core.api_keys import api_key_digest
from carpool.core.errors import ConfigError, InvalidInput
from carpool.core.settings import load_settings

KEY = "team-" + "t" * 27


def test_a_request_runs_in_its_keys_tier_or_a_lower_one_it_asks_for() -> None:
    assert request_tier("", "priority") == "priority"
    assert request_tier("flex", "default") == "flex"
    assert request_tier("default", "default") == "default"


def test_a_tier_above_the_keys_or_unknown_is_a_400_saying_what_to_ask_for() -> None:
    with pytest.raises(InvalidInput, match="above this API key's tier 'default'"):
        request_tier("priority", "default")
    with pytest.raises(InvalidInput, match="flex, default, priority or auto, not .gold."):
        request_tier("gold", "priority")


def test_default_keeps_room_for_priority_only_where_priority_keys_exist() -> None:
    assert tier_shares(False) == {"flex": 0.5, "default": 1.0, "priority": 1.0}
    assert tier_shares(True)["default"] < 1.0


def test_the_keys_file_binds_a_tier_and_names_the_line_of_an_unknown_one(
        tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{KEY} tier=flex\n")
    env = {"CARPOOL_API_KEYS_FILE": str(path)}
    assert load_settings(env).api_key_policies[api_key_digest(KEY)].tier == "flex"
    path.write_text(f"# tiers\n{KEY} tier=gold\n")
    with pytest.raises(ConfigError, match="line 2: key team...: tier must be one of"):
        load_settings(env)
