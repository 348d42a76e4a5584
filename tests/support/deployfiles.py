"""Readers for the deploy files, shared by the tests/deploy/test_deploy_*.py modules.

Parsing only, no assertions about carpool: compose YAML (with Compose's
``!reset`` tag and override merging), Dockerfiles, Kubernetes multi-document
YAML, the metric list, and the PromQL found in dashboards and rules.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
OPS = ROOT / "ops"
K8S = OPS / "k8s"


# --- compose -----------------------------------------------------------------


@dataclass(frozen=True)
class Reset:
    """Compose's ``!reset`` tag: in an override, replace the base value with this one."""

    value: Any


class ComposeLoader(yaml.SafeLoader):
    """A safe loader that also reads Compose's ``!reset`` tag."""


def _construct_reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    if isinstance(node, yaml.SequenceNode):
        return Reset(loader.construct_sequence(node, deep=True))
    if isinstance(node, yaml.MappingNode):
        return Reset(loader.construct_mapping(node, deep=True))
    return Reset(loader.construct_scalar(node))


ComposeLoader.add_constructor("!reset", _construct_reset)


def load_compose(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return yaml.load(f, Loader=ComposeLoader)  # a SafeLoader, plus one tag


def strip_resets(value: Any) -> Any:
    """The document as it would read with every ``!reset X`` written as plain ``X``."""
    if isinstance(value, Reset):
        return strip_resets(value.value)
    if isinstance(value, dict):
        return {k: strip_resets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_resets(v) for v in value]
    return value


def merge_compose(base: Any, override: Any) -> Any:
    """Merge an override file into a base one, as ``docker compose -f a -f b`` does.

    Only what carpool's overrides use: mappings merge key by key, scalars
    replace, ``!reset`` replaces. Compose merges sequences by rules of its own,
    so a plain sequence in an override is refused rather than merged wrongly.
    """
    if isinstance(override, Reset):
        return strip_resets(override.value)
    if isinstance(override, dict):
        merged = dict(base) if isinstance(base, dict) else {}
        for key, value in override.items():
            merged[key] = merge_compose(merged.get(key), value)
        return merged
    if isinstance(override, list):
        raise ValueError(f"sequence {override!r} in an override: use !reset, or extend this merge")
    return override


def argv_of(command: str | list[str]) -> list[str]:
    """A compose ``command`` as an argv list (compose splits a string like a shell)."""
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def grace_seconds(duration: str) -> float:
    """A compose duration such as ``60s``, ``1m30s`` or ``500ms`` in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a compose duration: {duration!r}")
    return sum(float(n) * units[u] for n, u in parts)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after ``flag`` in an argv (``--flag value``), or None when absent."""
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[i + 1]
    return None


# --- Dockerfiles -----------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def read_dockerfile(path: Path) -> list[Instruction]:
    """Instructions in order, comments dropped and continuation lines joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    return instructions


def dockerfile_values(path: Path, keyword: str) -> list[str]:
    return [i.args for i in read_dockerfile(path) if i.keyword == keyword]


def dockerfile_cmd(path: Path) -> list[str]:
    """The exec-form CMD (the last one wins, as in Docker)."""
    cmds = dockerfile_values(path, "CMD")
    if not cmds:
        raise ValueError(f"{path.name} has no CMD")
    argv = json.loads(cmds[-1])
    if not isinstance(argv, list):
        raise ValueError(f"{path.name}: CMD is not in exec (JSON list) form")
    return argv


def dockerfile_arg_default(path: Path, name: str) -> str | None:
    for value in dockerfile_values(path, "ARG"):
        key, _, default = value.partition("=")
        if key == name:
            return default
    return None


# --- Kubernetes --------------------------------------------------------------------


def k8s_documents(folder: Path = K8S) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every manifest in the folder, one per YAML document, kustomization excluded."""
    for path in sorted(folder.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        with path.open() as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    yield path, doc


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) for each Deployment and StatefulSet."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield doc, doc["spec"]["template"]


# --- metrics and PromQL ---------------------------------------------------------------

METRIC_TYPES = ("counter", "gauge", "histogram")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
_METRIC = re.compile(r"\bcarpool_[a-z0-9_]+")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: tuple[str, ...]


def load_metrics(path: Path = OPS / "metrics.txt") -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 3 or fields[1] not in METRIC_TYPES:
            raise ValueError(f"{path.name}:{number}: want 'name type labels', got {raw!r}")
        name, kind, labels = fields
        if name in metrics:
            raise ValueError(f"{path.name}:{number}: {name} listed twice")
        metrics[name] = Metric(name, kind, () if labels == "-" else tuple(labels.split(",")))
    return metrics


def metric_names_in(expr: str) -> set[str]:
    """Every ``carpool_*`` series name an expression mentions."""
    return set(_METRIC.findall(expr))


def undeclared(names: set[str], metrics: dict[str, Metric]) -> set[str]:
    """Names that are neither a declared metric nor a series of a declared histogram."""
    unknown = set()
    for name in names:
        if name in metrics:
            continue
        base = next((name.removesuffix(s) for s in HISTOGRAM_SERIES if name.endswith(s)), None)
        if base in metrics and metrics[base].type == "histogram":
            continue
        unknown.add(name)
    return unknown


def calls(expr: str, function: str) -> list[str]:
    """The argument text of each ``function(...)`` call in a PromQL expression."""
    found = []
    for match in re.finditer(rf"\b{function}\s*\(", expr):
        depth, start = 1, match.end()
        for i in range(start, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            if depth == 0:
                found.append(expr[start:i])
                break
        else:
            raise ValueError(f"unbalanced parentheses in {expr!r}")
    return found


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL query of a Grafana dashboard: panel targets and template variables."""
    exprs = []
    panels = list(dashboard.get("panels", []))
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        exprs.extend(t["expr"] for t in panel.get("targets", []) if "expr" in t)
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else str(query or ""))
    return [e for e in exprs if e]


def rule_exprs(groups: list[dict[str, Any]]) -> list[str]:
    return [rule["expr"] for group in groups for rule in group["rules"]]


# --- shared by the tests/deploy/test_deploy_*.py modules -------------------------------------

CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_CPU = ROOT / "docker-compose.cpu.yml"
WEB_DOCKERFILE = OPS / "docker" / "web.Dockerfile"
WORKER_DOCKERFILE = OPS / "docker" / "worker.Dockerfile"
FLOWER_DOCKERFILE = OPS / "docker" / "flower.Dockerfile"
#: Which Dockerfile builds each image that compose and Kubernetes run.
DOCKERFILE_OF_IMAGE = {"carpool-web": WEB_DOCKERFILE, "carpool-worker": WORKER_DOCKERFILE,
                       "carpool-flower": FLOWER_DOCKERFILE}
#: The oldest Kubernetes the manifests promise to fit, and the newest schema bundled.
K8S_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
#: A worker must outlast its slowest batch plus the lease hand-back on SIGTERM.
MIN_WORKER_GRACE_S = 60
CARPOOL_SERVICES = ("web", "worker", "flower", "dispatcher", "feeder")


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

def scrape_jobs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((OPS / "prometheus" / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


EXPRESSION_SOURCES = {
    "dashboard": lambda: dashboard_exprs(dashboard()),
    "alerts": lambda: rule_exprs(alert_groups()),
    "keda": keda_exprs,
}


#: Kinds whose schema kubernetes-validate does not ship: checked field by field below.
CUSTOM_KINDS = {"ScaledObject", "PodMonitor", "PrometheusRule"}

