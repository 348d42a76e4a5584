"""`carpool status` against real gunicorn: each model's line shows the jobs admission
refused by service tier, as GET /models counts them (no worker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from carpool.cli import main
from tests.conftest import make_env
from tests.support.procs import start_web
from tests.support.webtools import CATALOGUE_TOML

FLEX = "flex-key-0123456789abcdef0123"
PRIO = "prio-key-0123456789abcdef0123"


def test_status_shows_each_models_refusals_by_service_tier(
        redis_url: str, key_prefix: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, keys = tmp_path / "catalogue.toml", tmp_path / "keys"
    config.write_text(CATALOGUE_TOML)
    keys.write_text(f"{FLEX} tier=flex\n{PRIO} tier=priority\n")
    env = make_env(redis_url, key_prefix, CARPOOL_CONFIG=str(config),
                   CARPOOL_API_KEYS_FILE=str(keys))
    with start_web(env) as base, requests.Session() as s:
        # tiny holds 2 jobs: flex may fill 1, priority both.
        statuses = [s.post(f"{base}/submit", json={"model": "tiny", "input": {"value": 0,
                                                                          "size": 1}},
                           headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code
                    for key in (FLEX, FLEX, FLEX, PRIO, PRIO)]
        assert statuses == [202, 429, 429, 202, 429]
        assert main(["status", "--url", base, "--api-key", PRIO]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["tiny"].endswith("depth 2      only=2  refused priority=1 default=0 flex=2")
    assert lines["synthetic"].endswith("refused priority=0 default=0 flex=0")
