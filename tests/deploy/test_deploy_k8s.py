"""Kubernetes manifests, checked offline against kubernetes-validate's bundled schemas;
KEDA and Prometheus Operator resources, which have none, field by field.
"""

from __future__ import annotations

import copy
import re
from dataclasses import fields

import kubernetes_validate
import pytest
import yaml

from carpool.core.settings import Settings
from tests.support.deployfiles import (
    CARPOOL_SERVICES,
    CUSTOM_KINDS,
    K8S,
    K8S_VERSIONS,
    MIN_WORKER_GRACE_S,
    ROOT,
    alert_groups,
    flag_value,
    grace_seconds,
    k8s_container,
    k8s_docs,
    k8s_documents,
    k8s_named,
    keda_exprs,
    pod_templates,
    service,
)

# --- Kubernetes ------------------------------------------------------------------------


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


def test_keda_scales_the_worker_deployment_on_the_need_gauge_from_zero() -> None:
    scaled = k8s_named("ScaledObject", "carpool-worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert k8s_named("Deployment", target["name"])
    assert spec["minReplicaCount"] == 0 <= spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    # The gauge is a replica count: AverageValue 1 makes the HPA ask for exactly it
    # (tests/deploy/test_deploy_scaling.py replays it).
    assert trigger["metricType"] == "AverageValue"
    metadata = trigger["metadata"]
    assert {"serverAddress", "query", "threshold", "activationThreshold"} <= metadata.keys()
    # The CRD types metadata as map[string]string: a bare 1 is refused.
    assert all(isinstance(v, str) for v in metadata.values()), metadata
    assert (metadata["threshold"], metadata["activationThreshold"]) == ("1", "0")
    # The web down: an error keeps the replicas, where an empty answer read as 0 would
    # scale busy workers away.
    assert metadata["ignoreNullValues"] == "false"
    assert "max by (model) (carpool_workers_needed)" in " ".join(keda_exprs())


def test_worker_grace_outlasts_the_warm_shutdown_of_a_batch() -> None:
    # SIGTERM finishes the batch in hand within CARPOOL_STOP_GRACE_S, then hands the
    # rest back; the pod's grace must leave time for that hand-back after it.
    pod = k8s_named("Deployment", "carpool-worker")["spec"]["template"]["spec"]
    config = k8s_named("ConfigMap", "carpool-config")["data"]
    default_s = next(f.default for f in fields(Settings) if f.name == "stop_grace_s")
    stop_grace_s = float(config.get("CARPOOL_STOP_GRACE_S", default_s))
    assert pod["terminationGracePeriodSeconds"] >= stop_grace_s + 10


def test_k8s_alert_rules_equal_the_prometheus_alert_file() -> None:
    rule = k8s_named("PrometheusRule", "carpool")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == alert_groups()


def test_k8s_pod_monitor_scrapes_every_carpool_process_kind() -> None:
    monitor = k8s_named("PodMonitor", "carpool")
    selected = set(monitor["spec"]["selector"]["matchExpressions"][0]["values"])
    assert selected == {f"carpool-{n}" for n in CARPOOL_SERVICES}
    endpoints = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    for name in CARPOOL_SERVICES:
        ports = {p["name"] for p in k8s_container(f"carpool-{name}")["ports"]}
        assert ports & endpoints, f"carpool-{name} has no port the PodMonitor scrapes"

