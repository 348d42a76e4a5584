"""The KEDA ScaledObject's scaling, replayed against recorded carpool_workers_needed
series (tests/deploy/data/workers_needed.prom, written by ``carpool bench
simulate-scaling --scenarios burst,from-zero --record``: two web pods exporting the
gauge, a scrape every 15 s).

The replay models what KEDA and the HPA do with the manifest's own settings (not a
live cluster): KEDA activates 0 -> 1 above ``activationThreshold`` and returns to 0
after ``cooldownPeriod`` inactive; the HPA's replica count for an AverageValue
target is ceil(value / threshold), for a Value target ceil(current × value /
threshold), each with its 10 % tolerance, its scale-up default (at most double, or 4
pods, per 15 s) and the manifest's scale-down window and policy.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.deployfiles import k8s_named

SERIES = Path(__file__).resolve().parent / "data" / "workers_needed.prom"
#: The one query shape the replay evaluates.
QUERY = "sum(max by (model) (carpool_workers_needed))"
TOLERANCE = 0.1
SAMPLE = re.compile(r'^carpool_workers_needed\{model="([^"]+)",pod="([^"]+)"\} (\S+) (\d+)$')


def query_values() -> list[tuple[float, float]]:
    """(time s, the query's value) per scrape: max over pods per model, summed."""
    by_time: dict[int, dict[str, float]] = defaultdict(dict)
    for line in SERIES.read_text().splitlines():
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, line
        model, _, value, t_ms = m.groups()
        per_model = by_time[int(t_ms)]
        per_model[model] = max(per_model.get(model, 0.0), float(value))
    return [(t / 1000.0, sum(v.values())) for t, v in sorted(by_time.items())]


@dataclass
class Replay:
    spec: dict[str, Any]

    def run(self, values: list[tuple[float, float]]) -> list[tuple[float, float, int]]:
        """(time s, value, replicas after this poll) per scrape."""
        trigger = self.spec["triggers"][0]
        meta = trigger["metadata"]
        threshold, activation = float(meta["threshold"]), float(meta["activationThreshold"])
        down = self.spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        window_s = down["stabilizationWindowSeconds"]
        policy = down["policies"][0]
        assert policy["type"] == "Pods"
        lo, hi = max(1, self.spec.get("minReplicaCount", 0)), self.spec["maxReplicaCount"]
        replicas, last_active_s = self.spec.get("minReplicaCount", 0), -math.inf
        history: list[tuple[float, int]] = []
        removed: list[tuple[float, int]] = []
        out = []
        for t, value in values:
            if value > activation:
                last_active_s = t
            if replicas == 0:
                replicas = 1 if value > activation else 0
            elif value <= activation and t - last_active_s >= self.spec["cooldownPeriod"]:
                replicas = self.spec.get("minReplicaCount", 0)
            else:
                replicas = self._hpa(trigger["metricType"], value, threshold, replicas, lo, hi,
                                     t, window_s, policy, history, removed)
            out.append((t, value, replicas))
        return out

    @staticmethod
    def _hpa(kind: str, value: float, threshold: float, current: int, lo: int, hi: int,
             t: float, window_s: float, policy: dict[str, Any],
             history: list[tuple[float, int]], removed: list[tuple[float, int]]) -> int:
        ratio = value / (threshold * current) if kind == "AverageValue" else value / threshold
        if abs(ratio - 1.0) <= TOLERANCE:
            desired = current
        elif kind == "AverageValue":
            desired = math.ceil(value / threshold)
        else:
            desired = math.ceil(current * ratio)
        desired = min(hi, max(lo, desired))
        history.append((t, desired))
        if desired > current:  # scaleUp: no window; the default policy
            return min(desired, max(2 * current, current + 4))
        recommended = max(d for s, d in history if s > t - window_s)
        if recommended >= current:
            return current
        budget = policy["value"] - sum(n for s, n in removed if s > t - policy["periodSeconds"])
        step = min(current - recommended, max(0, budget))
        if step:
            removed.append((t, step))
        return current - step


@pytest.fixture
def scaled() -> dict[str, Any]:
    spec: dict[str, Any] = k8s_named("ScaledObject", "carpool-worker")["spec"]
    assert [t["metadata"]["query"] for t in spec["triggers"]] == [QUERY]
    return spec


def test_the_recording_holds_a_scale_from_zero_and_a_burst() -> None:
    values = [v for _, v in query_values()]
    assert max(values) >= 3 and values[-1] == 0
    assert any(a == 0 and b > 0 for a, b in zip(values, values[1:], strict=False))


def test_scales_from_zero_at_the_first_poll_that_needs_a_worker(scaled: dict[str, Any]) -> None:
    assert scaled["minReplicaCount"] == 0
    replay = Replay(scaled).run(query_values())
    starts = [now for (_, _, was), (_, value, now) in zip(replay, replay[1:], strict=False)
              if was == 0 and value > 0]
    assert starts and min(starts) >= 1
    assert replay[-1][2] == 0, "back to zero once nothing is needed for the cooldown"


def test_never_fewer_workers_than_the_gauge_asks_for(scaled: dict[str, Any]) -> None:
    # The gauge counts the workers holding leases or loading: so a scale-down never
    # goes below them, and a scale-up reaches the need at the poll that sees it.
    for _, value, replicas in Replay(scaled).run(query_values()):
        assert replicas >= min(value, scaled["maxReplicaCount"])


def test_scales_down_one_worker_a_minute_after_the_window(scaled: dict[str, Any]) -> None:
    replay = Replay(scaled).run(query_values())
    window = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"]
    downs = [(t, was - now) for (_, _, was), (t, _, now) in zip(replay, replay[1:], strict=False)
             if 1 <= now < was]
    assert downs, "the recording scales down after its burst"
    for t, step in downs:
        assert step == 1
        recent = [v for s, v, _ in replay if t - window < s <= t]
        assert max(recent) <= next(r for s, _, r in replay if s == t)
    times = [t for t, _ in downs]
    assert all(b - a >= 60 for a, b in zip(times, times[1:], strict=False))


def test_a_value_target_would_multiply_the_count_by_the_replicas(
        scaled: dict[str, Any]) -> None:
    # Why the manifest says AverageValue: the gauge is a replica count already.
    as_value = {**scaled, "triggers": [{**scaled["triggers"][0], "metricType": "Value"}]}
    over = [r - v for _, v, r in Replay(as_value).run(query_values())]
    assert max(over) >= 2
    fitted = [r - v for _, v, r in Replay(scaled).run(query_values()) if v > 0]
    assert max(fitted) < max(over)
