"""The keys file's options beyond the key: admin, quotas; a malformed line stops
start-up with an error that names the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.core.api_keys import KeyPolicy, api_key_digest
from carpool.core.errors import ConfigError
from carpool.core.settings import load_settings

OPS = "ops-" + "o" * 28
TEAM = "team-" + "t" * 27


def _keys_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "keys"
    path.write_text(text)
    return {"CARPOOL_API_KEYS_FILE": str(path)}


def test_admin_and_quotas_are_read_per_key(tmp_path: Path) -> None:
    env = _keys_file(tmp_path, f"# keys\n{OPS} admin\n{TEAM} weight=2 "
                               "quota_device_s_per_hour=1.5 quota_jobs_per_s=20\n")
    policies = load_settings(env).api_key_policies
    assert policies == {api_key_digest(OPS): KeyPolicy(admin=True),
                        api_key_digest(TEAM): KeyPolicy(quota_device_s_per_hour=1.5,
                                                        quota_jobs_per_s=20.0)}


@pytest.mark.parametrize("option", ["quota_device_s_per_hour=", "quota_device_s_per_hour=-1",
                                    "quota_jobs_per_s=lots", "quota_jobs_per_s=inf"])
def test_a_malformed_quota_names_its_line_and_the_form_to_write(
        tmp_path: Path, option: str) -> None:
    env = _keys_file(tmp_path, f"{OPS}\n\n{TEAM} {option}\n")
    name = option.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"line 3: key team\.\.\.: write '{name}=N'"):
        load_settings(env)


@pytest.mark.parametrize("option", ["quota_bytes=3", "admin=yes", "quota=1"])
def test_an_unknown_option_names_its_line_and_the_options_allowed(
        tmp_path: Path, option: str) -> None:
    env = _keys_file(tmp_path, f"{TEAM} {option}\n")
    with pytest.raises(ConfigError, match=r"line 1: .*unknown option.*quota_jobs_per_s"):
        load_settings(env)


@pytest.mark.parametrize("text", ["", "\n\n", "# every key revoked\n", "\ufeff# revoked\n"])
def test_a_keys_file_without_a_key_stops_start_up_not_opens_the_service(
        tmp_path: Path, text: str) -> None:
    """No key at all means no key is asked for: an emptied file fails closed."""
    with pytest.raises(ConfigError, match="holds no key"):
        load_settings(_keys_file(tmp_path, text))


def test_a_keys_file_that_is_not_utf8_is_a_config_error_naming_the_byte(
        tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(f"# caf\xe9\n{OPS}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8 \(byte 6\)"):
        load_settings({"CARPOOL_API_KEYS_FILE": str(path)})


def test_a_bom_before_the_first_key_is_not_part_of_it(tmp_path: Path) -> None:
    settings = load_settings(_keys_file(tmp_path, f"\ufeff{OPS} admin\n"))
    assert settings.api_key_policies == {api_key_digest(OPS): KeyPolicy(admin=True)}
