"""Webhook settings: secrets per deployment and per API key, checked at start."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from carpool.core.errors import ConfigError
from carpool.core.settings import api_key_digest, load_settings

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
KEY = "k" * 32


def test_an_api_key_entry_may_carry_its_own_webhook_secret() -> None:
    other = "o" * 32
    s = load_settings({"CARPOOL_API_KEYS": f"{KEY} webhook_secret={SECRET},{other}",
                       "CARPOOL_WEBHOOK_SECRET": SECRET.replace("c3Nz", "dGRk")})
    hooks = s.webhooks
    assert hooks.secret_for(api_key_digest(KEY)) == SECRET
    assert hooks.secret_for(api_key_digest(other)) == hooks.secret != SECRET
    assert s.api_key_digests == {api_key_digest(KEY), api_key_digest(other)}


def test_the_keys_file_takes_weight_and_webhook_secret_together(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# keys\n{KEY} weight=2 webhook_secret={SECRET}\n")
    s = load_settings({"CARPOOL_API_KEYS_FILE": str(path)})
    assert s.api_key_weights[api_key_digest(KEY)] == 2.0
    assert s.webhooks.key_secrets[api_key_digest(KEY)] == SECRET


@pytest.mark.parametrize("secret", ["", "whsec_", "secret", "whsec_short", "whsec_!!!!",
                                    SECRET.removeprefix("whsec_")])
def test_a_weak_or_malformed_secret_fails_at_start_saying_how_to_make_one(secret: str) -> None:
    with pytest.raises(ConfigError, match="whsec_"):
        load_settings({"CARPOOL_API_KEYS": f"{KEY} webhook_secret={secret}"})
    if secret:
        with pytest.raises(ConfigError, match="CARPOOL_WEBHOOK_SECRET"):
            load_settings({"CARPOOL_WEBHOOK_SECRET": secret})


def test_an_unknown_key_option_fails_at_start_naming_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="webhook_secret"):
        load_settings({"CARPOOL_API_KEYS": f"{KEY} colour=blue"})


@pytest.mark.parametrize(("name", "value"), [("CARPOOL_WEBHOOK_RETRY_BASE_S", "-1"),
                                             ("CARPOOL_WEBHOOK_MAX_AGE_S", "soon"),
                                             ("CARPOOL_WEBHOOK_READ_TIMEOUT_S", "0"),
                                             ("CARPOOL_WEBHOOK_RETRY_MAX_S", "inf")])
def test_bad_webhook_durations_fail_at_start(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        load_settings({name: value})


def test_a_base_above_the_cap_names_both() -> None:
    with pytest.raises(ConfigError, match="RETRY_BASE_S.*RETRY_MAX_S"):
        load_settings({"CARPOOL_WEBHOOK_RETRY_BASE_S": "10", "CARPOOL_WEBHOOK_RETRY_MAX_S": "1"})


@pytest.mark.parametrize("value", ["true", "yes", "on", " 1", "2"])
def test_allow_private_is_a_flag_like_the_others(value: str) -> None:
    # docs/reference.md: a flag is 0 or 1, anything else is refused. "true" was read
    # as 0, so a deployment that meant to allow its private receivers silently did not.
    with pytest.raises(ConfigError, match="CARPOOL_WEBHOOK_ALLOW_PRIVATE"):
        load_settings({"CARPOOL_WEBHOOK_ALLOW_PRIVATE": value})
    assert load_settings({"CARPOOL_WEBHOOK_ALLOW_PRIVATE": "1"}).webhooks.allow_private
    assert not load_settings({"CARPOOL_WEBHOOK_ALLOW_PRIVATE": "0"}).webhooks.allow_private


@pytest.mark.parametrize(("name", "value"), [("CARPOOL_DISPATCH_CONCURRENCY", "0.5"),
                                             ("CARPOOL_DISPATCH_CONCURRENCY", "2.7"),
                                             ("CARPOOL_DISPATCH_METRICS_PORT", "70000"),
                                             ("CARPOOL_DISPATCH_METRICS_PORT", "9300.5")])
def test_the_dispatchers_counts_are_whole_and_its_port_a_port(name: str, value: str) -> None:
    # 0.5 threads was 0 (the dispatcher died at start with a ValueError), 70000 a port
    # that failed only at bind; the worker's and feeder's ports were refused at start.
    with pytest.raises(ConfigError, match=name):
        load_settings({name: value})
    s = load_settings({"CARPOOL_DISPATCH_CONCURRENCY": "3", "CARPOOL_DISPATCH_METRICS_PORT": "0"})
    assert (s.webhooks.concurrency, s.webhooks.metrics_port) == (3, 0)
