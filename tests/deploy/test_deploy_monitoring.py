"""Prometheus, Grafana and the metric names: every name used anywhere is in ops/metrics.txt.
"""

from __future__ import annotations

import math
import re

import pytest
import yaml

from tests.support.commands import load_commands
from tests.support.deployfiles import (
    EXPRESSION_SOURCES,
    OPS,
    ROOT,
    alert_groups,
    calls,
    dashboard,
    dashboard_exprs,
    k8s_named,
    load_metrics,
    metric_names_in,
    scrape_jobs,
    service,
    undeclared,
)

# --- Prometheus and Grafana ------------------------------------------------------------



def test_prometheus_scrapes_web_every_worker_replica_and_flower() -> None:
    jobs = scrape_jobs()
    worker_sd = jobs["carpool-worker"]["dns_sd_configs"][0]
    assert worker_sd["names"] == ["worker"] and worker_sd["type"] == "A"
    assert str(worker_sd["port"]) == service("worker")["environment"]["CARPOOL_WORKER_METRICS_PORT"]
    assert jobs["carpool-web"]["dns_sd_configs"][0]["port"] == 8000
    assert jobs["carpool-flower"]["static_configs"][0]["targets"] == ["flower:5555"]
    assert "--port=5555" in load_commands()["flower"]


def test_prometheus_loads_the_alert_file_it_is_mounted_with() -> None:
    config = yaml.safe_load((OPS / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert "./ops/prometheus:/etc/prometheus:ro" in service("prometheus")["volumes"]
    assert (OPS / "prometheus" / "alerts.yml").exists()


def test_no_worker_alert_watches_the_job_that_scrapes_workers() -> None:
    expr = next(
        r["expr"] for g in alert_groups() for r in g["rules"] if r["alert"] == "CarpoolNoWorkerUp"
    )
    assert 'up{job="carpool-worker"}' in expr
    assert "carpool-worker" in scrape_jobs()
    # On Kubernetes the PodMonitor takes the job name from this pod label.
    monitor = k8s_named("PodMonitor", "carpool")
    labels = k8s_named("Deployment", "carpool-worker")["spec"]["template"]["metadata"]["labels"]
    assert labels[monitor["spec"]["jobLabel"]] == "carpool-worker"


def test_alert_rules_cover_the_operating_conditions() -> None:
    rules = {r["alert"]: r for g in alert_groups() for r in g["rules"]}
    wanted = {
        "CarpoolOldestJobTooOld": {"carpool_bin_oldest_age_seconds"},
        "CarpoolBatchSizeStuckAtOne": {"carpool_batch_size_sum", "carpool_bin_depth"},
        "CarpoolHighRejectionRate": {"carpool_jobs_rejected_total"},
        "CarpoolBatchLimitShrinkLoop": {"carpool_batch_limit_shrinks_total"},
        "CarpoolNoWorkerUp": set(),
    }
    for alert, metrics in wanted.items():
        assert alert in rules, alert
        assert metrics <= metric_names_in(rules[alert]["expr"]), alert
    for alert, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), alert
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], alert
        assert f"`{alert}`" in (ROOT / "docs" / "operations.md").read_text(), (
            f"{alert} is not explained in docs/operations.md"
        )


def test_dashboard_shows_queues_batches_latency_gpu_memory_and_rejections() -> None:
    used = set().union(*(metric_names_in(e) for e in dashboard_exprs(dashboard())))
    for name in (
        "carpool_bin_depth",
        "carpool_bin_oldest_age_seconds",
        "carpool_batch_size_bucket",
        "carpool_job_latency_seconds_bucket",
        "carpool_gpu_memory_used_bytes",
        "carpool_gpu_memory_reserved_bytes",
        "carpool_gpu_memory_free_bytes",
        "carpool_jobs_rejected_total",
    ):
        assert name in used, name


def test_dashboard_uses_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load(
        (OPS / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uid = provisioned["datasources"][0]["uid"]
    panels = [p for p in dashboard()["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert all(t["datasource"]["uid"] == uid for t in panel["targets"]), panel["title"]


def test_grafana_loads_dashboards_from_where_compose_mounts_them() -> None:
    provider = yaml.safe_load(
        (OPS / "grafana" / "provisioning" / "dashboards" / "carpool.yml").read_text()
    )["providers"][0]
    mount = f"./ops/grafana/dashboards:{provider['options']['path']}:ro"
    assert mount in service("grafana")["volumes"]


# --- metric names ----------------------------------------------------------------------


def test_metric_list_is_well_formed() -> None:
    metrics = load_metrics()
    assert len(metrics) >= 20
    for m in metrics.values():
        assert m.name.startswith("carpool_"), m.name
        assert m.name.endswith("_total") == (m.type == "counter"), m.name


@pytest.mark.parametrize("source", sorted(EXPRESSION_SOURCES))
def test_every_metric_used_is_declared(source: str) -> None:
    exprs = EXPRESSION_SOURCES[source]()
    used = set().union(*(metric_names_in(e) for e in exprs))
    assert used, f"no carpool metric found in {source}: the check would pass vacuously"
    assert not undeclared(used, load_metrics()), f"{source} uses undeclared metrics"


def test_metric_check_flags_an_unknown_name_and_a_gauge_read_as_histogram() -> None:
    metrics = load_metrics()
    assert undeclared({"carpool_bin_depth_total"}, metrics) == {"carpool_bin_depth_total"}
    assert undeclared({"carpool_bin_depth_bucket"}, metrics) == {"carpool_bin_depth_bucket"}
    assert not undeclared({"carpool_batch_size_bucket"}, metrics)


@pytest.mark.parametrize("source", sorted(EXPRESSION_SOURCES))
def test_counters_and_histogram_series_are_read_through_rate(source: str) -> None:
    # A raw counter or _bucket series resets on every restart; only rate() or
    # increase() turns it into a figure worth plotting or alerting on.
    pattern = re.compile(r"(\w+)\s*\(\s*(carpool_\w+?(?:_total|_bucket|_sum|_count))\b")
    bare = re.compile(r"carpool_\w+?(?:_total|_bucket|_sum|_count)\b")
    for expr in EXPRESSION_SOURCES[source]():
        wrapped = {name for fn, name in pattern.findall(expr) if fn in ("rate", "increase")}
        assert set(bare.findall(expr)) <= wrapped, expr


@pytest.mark.parametrize("source", sorted(EXPRESSION_SOURCES))
def test_histogram_quantiles_keep_the_le_label(source: str) -> None:
    for expr in EXPRESSION_SOURCES[source]():
        for args in calls(expr, "histogram_quantile"):
            assert "_bucket" in args, expr
            groupings = re.findall(r"\bby\s*\(([^)]*)\)", args)
            assert groupings and all(
                "le" in {g.strip() for g in by.split(",")} for by in groupings
            ), f"histogram_quantile without `by (le, ...)`: {expr}"




# --- what a new user sees: no impossible batch size, no alert on a typo ---------------------


def prometheus_quantile(q: float, buckets: list[tuple[float, int]]) -> float:
    """Prometheus' histogram_quantile on cumulative ``(le, count)`` buckets: the rank's
    bucket, then linear interpolation from its lower bound (0 for the first)."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0
    for upper, count in buckets:
        if count >= rank:
            return lower + (upper - lower) * (rank - below) / max(count - below, 1)
        lower, below = upper, count
    return lower


def cumulative(sizes: list[int], edges: tuple[float, ...]) -> list[tuple[float, int]]:
    return [(le, sum(1 for s in sizes if s <= le)) for le in edges]


def test_batch_size_panel_never_shows_a_size_a_batch_cannot_have() -> None:
    from worker.observe.metrics import BATCH_SIZE_BUCKETS

    assert all(float(le).is_integer() and le >= 1 for le in BATCH_SIZE_BUCKETS)
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])
             if "carpool_batch_size_bucket" in t.get("expr", "")]
    assert exprs, "the dashboard has a batch-size percentile panel"
    for expr in exprs:
        # Rounded up, outside the quantile: interpolation inside a bucket gives fractions.
        assert re.fullmatch(r"ceil\(histogram_quantile\(.*\)\)", expr), expr
    mostly_ones = [1] * 95 + [8] * 5
    raw = prometheus_quantile(0.5, cumulative(mostly_ones, BATCH_SIZE_BUCKETS))
    assert 0 < raw < 1  # what the panel showed before: no batch has 0.5 jobs
    for sizes in (mostly_ones, [3] * 10 + [17] * 10, [64] * 3):
        for q in (0.5, 0.95, 0.99):
            shown = math.ceil(prometheus_quantile(q, cumulative(sizes, BATCH_SIZE_BUCKETS)))
            assert 1 <= shown <= max(le for le in BATCH_SIZE_BUCKETS if le >= max(sizes))


def test_rejection_alert_watches_real_models_not_unknown_names() -> None:
    for groups in (alert_groups(), [g for d in [k8s_named("PrometheusRule", "carpool")]
                                    for g in d["spec"]["groups"]]):
        rule = next(r for g in groups for r in g["rules"]
                    if r["alert"] == "CarpoolHighRejectionRate")
        selectors = re.findall(r"(carpool_jobs_\w+_total)(\{[^}]*\})?", rule["expr"])
        assert selectors
        for name, matchers in selectors:
            # model="" holds rejections of names no model has: a ratio of 1 by nature.
            assert 'model!=""' in matchers, f"{name} without model!=\"\": {rule['expr']}"
