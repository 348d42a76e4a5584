"""The deploy files, checked offline: schemas first, then what a schema lets through.

Compose files go through the compose spec (check-jsonschema, from this venv),
Kubernetes manifests through kubernetes-validate's bundled schemas; KEDA and
Prometheus Operator resources, which have no bundled schema, through the fields
checked here. The process command lines are compared with ops/commands.toml,
which the end-to-end tests also start their processes from (tests/commands.py),
and every metric name used anywhere with ops/metrics.txt.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.commands import load_commands
from tests.deployfiles import (
    K8S,
    OPS,
    ROOT,
    argv_of,
    calls,
    dashboard_exprs,
    dockerfile_arg_default,
    dockerfile_cmd,
    dockerfile_values,
    flag_value,
    grace_seconds,
    k8s_documents,
    load_compose,
    load_metrics,
    merge_compose,
    metric_names_in,
    pod_templates,
    rule_exprs,
    strip_resets,
    undeclared,
)

CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_CPU = ROOT / "docker-compose.cpu.yml"
WEB_DOCKERFILE = OPS / "docker" / "web.Dockerfile"
WORKER_DOCKERFILE = OPS / "docker" / "worker.Dockerfile"
#: Which Dockerfile builds each image that compose and Kubernetes run.
DOCKERFILE_OF_IMAGE = {"carpool-web": WEB_DOCKERFILE, "carpool-worker": WORKER_DOCKERFILE}
#: The oldest Kubernetes the manifests promise to fit, and the newest schema bundled.
K8S_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
#: A worker must outlast its slowest batch plus the lease hand-back on SIGTERM.
MIN_WORKER_GRACE_S = 60
CARPOOL_SERVICES = ("web", "worker", "flower")


def compose() -> dict[str, Any]:
    return load_compose(COMPOSE)


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    if not CHECK_JSONSCHEMA.exists():
        pytest.fail(f"{CHECK_JSONSCHEMA} missing: install the dev extra")
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_json(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def k8s_docs() -> list[dict[str, Any]]:
    return [doc for _, doc in k8s_documents()]


def k8s_named(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"want one {kind}/{name}, found {len(matches)}"
    return matches[0]


def k8s_container(workload: str, kind: str = "Deployment") -> dict[str, Any]:
    containers = k8s_named(kind, workload)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{workload}: one container expected"
    return containers[0]


def alert_groups() -> list[dict[str, Any]]:
    return yaml.safe_load((OPS / "prometheus" / "alerts.yml").read_text())["groups"]


def dashboard() -> dict[str, Any]:
    return json.loads((OPS / "grafana" / "dashboards" / "carpool.json").read_text())


def keda_exprs() -> list[str]:
    scaled = k8s_named("ScaledObject", "carpool-worker")
    return [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]


# --- compose: schema ---------------------------------------------------------------


def test_compose_file_matches_the_compose_spec() -> None:
    result = check_compose_schema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpu_override_alone_matches_the_compose_spec(tmp_path: Path) -> None:
    # check-jsonschema cannot read `!reset`; the tag's value is what must be valid.
    plain = strip_resets(load_compose(COMPOSE_CPU))
    result = check_compose_schema(write_json(tmp_path, "override.json", plain))
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_merged_with_cpu_override_matches_the_compose_spec(tmp_path: Path) -> None:
    merged = merge_compose(compose(), load_compose(COMPOSE_CPU))
    result = check_compose_schema(write_json(tmp_path, "merged.json", merged))
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_check_rejects_a_misspelled_key(tmp_path: Path) -> None:
    broken = compose()
    broken["services"]["worker"]["stop_grace_perod"] = "60s"
    result = check_compose_schema(write_json(tmp_path, "broken.json", broken))
    assert result.returncode != 0


# --- compose: what the schema lets through ------------------------------------------


def test_cpu_override_drops_the_gpu_reservation_and_the_gpu_claim() -> None:
    base_worker = service("worker")
    assert base_worker["environment"]["CARPOOL_GPU_CLAIM"] == "1"
    assert base_worker["deploy"]["resources"]["reservations"]["devices"]
    merged = merge_compose(compose(), load_compose(COMPOSE_CPU))["services"]["worker"]
    assert merged["deploy"]["resources"]["reservations"].get("devices") in (None, [])
    assert merged["environment"]["CARPOOL_GPU_CLAIM"] == "0"
    # The override only adds: everything else the worker had is still there.
    assert (
        merged["environment"]["CARPOOL_REDIS_URL"]
        == base_worker["environment"]["CARPOOL_REDIS_URL"]
    )


def test_each_worker_replica_reserves_every_gpu_and_claims_one() -> None:
    worker = service("worker")
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert worker["environment"]["CARPOOL_GPU_CLAIM"] == "1"


def test_worker_can_be_scaled_to_several_replicas() -> None:
    worker = service("worker")
    # A fixed container name or a published host port allows only one replica.
    assert "container_name" not in worker
    assert "ports" not in worker
    assert "replicas" not in worker.get("deploy", {})


def test_worker_stops_with_a_warm_shutdown_and_enough_grace() -> None:
    worker = service("worker")
    assert worker["stop_signal"] == "SIGTERM"
    assert grace_seconds(worker["stop_grace_period"]) >= MIN_WORKER_GRACE_S
    assert dockerfile_values(WORKER_DOCKERFILE, "STOPSIGNAL") == ["SIGTERM"]


def test_flower_is_bound_to_loopback_and_needs_a_login() -> None:
    flower = service("flower")
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    login = flower["environment"]["FLOWER_BASIC_AUTH"]
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]*\}", login), login
    assert "FLOWER_UNAUTHENTICATED_API" not in flower["environment"]


def test_only_the_web_api_is_published_beyond_loopback() -> None:
    for name, svc in compose()["services"].items():
        for port in svc.get("ports", []):
            if name != "web":
                assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port}"


def test_redis_is_durable_bounded_and_password_protected() -> None:
    redis = service("redis")
    argv = argv_of(redis["command"])
    assert flag_value(argv, "--appendonly") == "yes"
    assert flag_value(argv, "--appendfsync") == "everysec"
    assert flag_value(argv, "--maxmemory-policy") == "noeviction"
    assert flag_value(argv, "--maxmemory"), "noeviction acts only under a maxmemory"
    assert flag_value(argv, "--requirepass") == "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
    assert "healthcheck" in redis
    assert any(str(v).endswith(":/data") for v in redis["volumes"])
    assert "ports" not in redis


def test_every_carpool_service_uses_the_one_password_protected_redis() -> None:
    urls = {service(n)["environment"]["CARPOOL_REDIS_URL"] for n in CARPOOL_SERVICES}
    assert urls == {"redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD}@redis:6379/0"}
    for name in CARPOOL_SERVICES:
        assert service(name)["depends_on"]["redis"]["condition"] == "service_healthy"


def test_web_healthcheck_asks_readyz_on_the_bound_port() -> None:
    check = " ".join(service("web")["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/readyz" in check
    assert "CARPOOL_WEB_BIND=0.0.0.0:8000" in dockerfile_values(WEB_DOCKERFILE, "ENV")


def test_web_stop_grace_outlasts_gunicorns_graceful_timeout() -> None:
    # A long-poll may hold a request for CARPOOL_MAX_WAIT_S; gunicorn waits
    # graceful_timeout for it on SIGTERM, and the platform must wait longer.
    from web import gunicorn_conf

    graceful_s = gunicorn_conf.graceful_timeout
    assert grace_seconds(service("web")["stop_grace_period"]) > graceful_s
    pod = k8s_named("Deployment", "carpool-web")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > graceful_s


def test_monitoring_services_run_only_under_the_monitoring_profile() -> None:
    services = compose()["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert services["grafana"]["profiles"] == ["monitoring"]
    for name in ("redis", *CARPOOL_SERVICES):
        assert "profiles" not in services[name]


# --- images and command lines ----------------------------------------------------------


def test_canonical_worker_command_runs_one_solo_process_with_events() -> None:
    argv = load_commands()["worker"]
    assert argv[:4] == ["celery", "-A", "worker.celery_app", "worker"]
    assert flag_value(argv, "--pool") == "solo"
    assert flag_value(argv, "--concurrency") == "1"
    assert "-E" in argv


def test_images_run_the_canonical_commands() -> None:
    commands = load_commands()
    assert dockerfile_cmd(WEB_DOCKERFILE) == commands["web"]
    assert dockerfile_cmd(WORKER_DOCKERFILE) == commands["worker"]


def test_compose_services_run_the_canonical_commands() -> None:
    commands = load_commands()
    for name in CARPOOL_SERVICES:
        svc = service(name)
        dockerfile = ROOT / svc["build"]["dockerfile"]
        argv = argv_of(svc["command"]) if "command" in svc else dockerfile_cmd(dockerfile)
        assert argv == commands[name], name


def test_k8s_containers_run_the_canonical_commands() -> None:
    commands = load_commands()
    for name in CARPOOL_SERVICES:
        container = k8s_container(f"carpool-{name}")
        image_cmd = dockerfile_cmd(DOCKERFILE_OF_IMAGE[container["image"]])
        argv = container.get("command", []) + container.get("args", [])
        assert (argv or image_cmd) == commands[name], name


def test_web_image_installs_no_torch() -> None:
    assert dockerfile_values(WEB_DOCKERFILE, "FROM") == ["python:3.11-slim"]
    runs = " ".join(dockerfile_values(WEB_DOCKERFILE, "RUN"))
    assert "pip install ." in runs
    assert "torch" not in runs and "[" not in runs, f"extras or torch in the web image: {runs}"
    with (ROOT / "pyproject.toml").open("rb") as f:
        base = tomllib.load(f)["project"]["dependencies"]
    assert not [d for d in base if d.lower().startswith("torch")]


def test_images_run_as_a_numeric_non_root_user() -> None:
    for dockerfile in (WEB_DOCKERFILE, WORKER_DOCKERFILE):
        users = dockerfile_values(dockerfile, "USER")
        assert users and users[-1].isdigit() and users[-1] != "0", dockerfile.name


def test_worker_base_image_holds_the_pinned_torch() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["worker"]
    pin = next(d.split("==")[1] for d in extra if d.startswith("torch=="))
    base = dockerfile_arg_default(WORKER_DOCKERFILE, "TORCH_IMAGE")
    assert base is not None and base.startswith(f"pytorch/pytorch:{pin}-cuda"), base
    assert dockerfile_values(WORKER_DOCKERFILE, "FROM") == ["${TORCH_IMAGE}"]
    assert "'.[worker" in " ".join(dockerfile_values(WORKER_DOCKERFILE, "RUN"))


def test_build_context_lets_in_only_the_sources() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list keeps .venv and .git out of the build context"
    assert {"!pyproject.toml", "!carpool/", "!web/", "!worker/"} <= set(lines)


# --- Prometheus and Grafana ------------------------------------------------------------


def scrape_jobs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((OPS / "prometheus" / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


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

EXPRESSION_SOURCES = {
    "dashboard": lambda: dashboard_exprs(dashboard()),
    "alerts": lambda: rule_exprs(alert_groups()),
    "keda": keda_exprs,
}


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


# --- Kubernetes ------------------------------------------------------------------------

#: Kinds whose schema kubernetes-validate does not ship: checked field by field below.
CUSTOM_KINDS = {"ScaledObject", "PodMonitor", "PrometheusRule"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_match_the_kubernetes_schema(version: str) -> None:
    seen = set()
    for path, doc in k8s_documents():
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {e.message}")
        seen.add(doc["kind"])
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap"} <= seen


def test_k8s_schema_check_rejects_a_misspelled_field() -> None:
    broken = copy.deepcopy(k8s_named("Deployment", "carpool-worker"))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_every_manifest_kind_is_checked() -> None:
    kinds = {doc["kind"] for doc in k8s_docs()}
    native = kinds - CUSTOM_KINDS
    for kind in native:
        doc = next(d for d in k8s_docs() if d["kind"] == kind)
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1])  # raises if no schema ships
    assert CUSTOM_KINDS <= kinds


def test_kustomization_lists_every_manifest_and_image() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    images = {i["name"] for i in kustomization["images"]}
    for _, template in pod_templates(k8s_docs()):
        for container in template["spec"]["containers"]:
            if container["image"].startswith("carpool-"):
                assert container["image"] in images, container["image"]


def test_k8s_selectors_and_ports_meet_their_pods() -> None:
    docs = k8s_docs()
    pods = [t for _, t in pod_templates(docs)]
    for workload, template in pod_templates(docs):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items()
    for svc in (d for d in docs if d["kind"] == "Service"):
        matched = [
            t for t in pods if svc["spec"]["selector"].items() <= t["metadata"]["labels"].items()
        ]
        assert len(matched) == 1, svc["metadata"]["name"]
        port_names = {p["name"] for c in matched[0]["spec"]["containers"] for p in c["ports"]}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names, svc["metadata"]["name"]
    statefulset = k8s_named("StatefulSet", "redis")
    assert k8s_named("Service", statefulset["spec"]["serviceName"])


def test_k8s_env_references_are_defined_before_use() -> None:
    # Kubernetes leaves an undefined $(VAR) in place, silently: the URL would
    # then carry the literal text "$(REDIS_PASSWORD)" as its password.
    docs = k8s_docs()
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    for _, template in pod_templates(docs):
        for container in template["spec"]["containers"]:
            defined = set()
            for source in container.get("envFrom", []):
                defined |= set(configmaps[source["configMapRef"]["name"]])
            for var in container.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", var.get("value", "")):
                    assert ref in defined, f"{container['name']}: {var['name']} uses $({ref})"
                defined.add(var["name"])
            for arg in container.get("command", []) + container.get("args", []):
                for ref in re.findall(r"\$\((\w+)\)", arg):
                    assert ref in defined, f"{container['name']}: argument uses $({ref})"


def test_k8s_secrets_are_ones_the_docs_tell_how_to_create() -> None:
    docs_text = (ROOT / "docs" / "operations.md").read_text()
    refs = set()
    for _, template in pod_templates(k8s_docs()):
        for container in template["spec"]["containers"]:
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
    assert refs
    for name, key in refs:
        assert re.search(rf"create secret generic {name}\b[^\n]*--from-literal={key}=", docs_text)


def test_k8s_redis_is_durable_bounded_and_password_protected() -> None:
    container = k8s_container("redis", kind="StatefulSet")
    argv = container["args"]
    assert flag_value(argv, "--appendonly") == "yes"
    assert flag_value(argv, "--appendfsync") == "everysec"
    assert flag_value(argv, "--maxmemory-policy") == "noeviction"
    assert flag_value(argv, "--requirepass") == "$(REDIS_PASSWORD)"
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    claims = k8s_named("StatefulSet", "redis")["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]


def test_k8s_web_probes_liveness_and_readiness_apart() -> None:
    container = k8s_container("carpool-web")
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_k8s_worker_holds_one_gpu_and_stops_warm() -> None:
    deployment = k8s_named("Deployment", "carpool-worker")
    pod = deployment["spec"]["template"]["spec"]
    container = k8s_container("carpool-worker")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert env["CARPOOL_GPU_CLAIM"] == "0", "one GPU per pod: nothing to claim"
    assert pod["terminationGracePeriodSeconds"] >= MIN_WORKER_GRACE_S
    assert pod["terminationGracePeriodSeconds"] == grace_seconds(
        service("worker")["stop_grace_period"]
    )
    # SIGTERM reaches Celery directly and is its warm shutdown: no hook in between.
    assert "preStop" not in container.get("lifecycle", {})
    # KEDA owns the replica count; a fixed one would be reset on every apply.
    assert "replicas" not in deployment["spec"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_k8s_flower_is_cluster_internal_with_a_login_from_a_secret() -> None:
    svc = k8s_named("Service", "carpool-flower")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    env = {v["name"]: v for v in k8s_container("carpool-flower")["env"]}
    assert "secretKeyRef" in env["FLOWER_BASIC_AUTH"]["valueFrom"]
    assert "FLOWER_UNAUTHENTICATED_API" not in env


def test_keda_scales_the_worker_deployment_through_prometheus() -> None:
    scaled = k8s_named("ScaledObject", "carpool-worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert k8s_named("Deployment", target["name"])
    assert 0 <= spec.get("minReplicaCount", 0) <= spec["maxReplicaCount"]
    assert spec["triggers"]
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        assert trigger.get("metricType", "AverageValue") in ("AverageValue", "Value")
        metadata = trigger["metadata"]
        assert {"serverAddress", "query", "threshold"} <= metadata.keys()
        # The CRD types metadata as map[string]string: a bare 256 is refused.
        assert all(isinstance(v, str) for v in metadata.values()), metadata
        assert float(metadata["threshold"]) > 0
    queries = " ".join(keda_exprs())
    assert "carpool_bin_depth" in queries and "carpool_bin_oldest_age_seconds" in queries


def test_k8s_alert_rules_equal_the_prometheus_alert_file() -> None:
    rule = k8s_named("PrometheusRule", "carpool")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == alert_groups()


def test_k8s_pod_monitor_scrapes_web_workers_and_flower() -> None:
    monitor = k8s_named("PodMonitor", "carpool")
    selected = set(monitor["spec"]["selector"]["matchExpressions"][0]["values"])
    assert selected == {f"carpool-{n}" for n in CARPOOL_SERVICES}
    endpoints = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    for name in CARPOOL_SERVICES:
        ports = {p["name"] for p in k8s_container(f"carpool-{name}")["ports"]}
        assert ports & endpoints, f"carpool-{name} has no port the PodMonitor scrapes"
