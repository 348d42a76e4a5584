"""The alert rules evaluated by Prometheus's own rule tester (``promtool test rules``) on
made-up series: each alert fires where it should and stays quiet where it should not.
Needs ``promtool`` (Debian's ``prometheus`` package); skipped where it is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deployfiles import OPS

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (apt: prometheus)")
#: promtool's own bound on a run of a few rules and series is far under this.
PROMTOOL_TIMEOUT_S = 60


def promtool_test(tmp_path: Path, tests: list[dict[str, object]]) -> None:
    spec = {"rule_files": [str(OPS / "prometheus" / "alerts.yml")],
            "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "rules_test.yml"
    path.write_text(yaml.safe_dump(spec))
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True,
                         text=True, timeout=PROMTOOL_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


@needs_promtool
def test_the_alert_rules_load() -> None:
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, "check", "rules", str(OPS / "prometheus" / "alerts.yml")],
                         capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def rule(name: str) -> dict[str, Any]:
    rules = yaml.safe_load((OPS / "prometheus" / "alerts.yml").read_text())
    found: dict[str, Any] = next(r for g in rules["groups"] for r in g["rules"]
                                 if r["alert"] == name)
    return found


@needs_promtool
def test_web_shedding_fires_for_the_web_that_sheds_and_not_for_a_trickle(
        tmp_path: Path) -> None:
    description = rule("CarpoolWebShedding")["annotations"]["description"].replace(
        "{{ $labels.instance }}", "web-0:8000")
    promtool_test(tmp_path, [{
        "interval": "1m",
        "input_series": [
            # One shed a second at web-0; one a minute at web-1 (a blip, no alert).
            {"series": 'carpool_web_shed_total{instance="web-0:8000",reason="queued"}',
             "values": "0+60x20"},
            {"series": 'carpool_web_shed_total{instance="web-1:8000",reason="queued"}',
             "values": "0+1x20"},
        ],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "CarpoolWebShedding", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "CarpoolWebShedding", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "instance": "web-0:8000"},
                 "exp_annotations": {"summary": "web-0:8000: 1 submits/s shed",
                                     "description": description}}]},
        ],
    }])


def test_the_shedding_alert_watches_sheds_per_web_instance() -> None:
    expr = rule("CarpoolWebShedding")["expr"]
    assert "carpool_web_shed_total" in expr and "by (instance)" in expr
