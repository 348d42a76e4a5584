"""Compose files and images, checked offline: the compose spec first, then what it lets through.

Process command lines are compared with carpool/stack/commands.toml, which the end-to-end
tests also start their processes from (tests/support/commands.py).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.support.commands import load_commands
from tests.support.deployfiles import (
    CARPOOL_SERVICES,
    COMPOSE,
    COMPOSE_CPU,
    DOCKERFILE_OF_IMAGE,
    FLOWER_DOCKERFILE,
    MIN_WORKER_GRACE_S,
    ROOT,
    WEB_DOCKERFILE,
    WORKER_DOCKERFILE,
    argv_of,
    check_compose_schema,
    compose,
    dockerfile_arg_default,
    dockerfile_cmd,
    dockerfile_values,
    flag_value,
    grace_seconds,
    k8s_container,
    k8s_named,
    load_compose,
    merge_compose,
    service,
    strip_resets,
    write_json,
)

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
    # The s3 extra only (boto3, for batch files in object storage): no worker stack.
    assert "pip install --constraint requirements/constraints.txt '.[s3]'" in runs
    assert "torch" not in runs and "worker" not in runs, f"torch in the web image: {runs}"
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    base, s3 = project["dependencies"], project["optional-dependencies"]["s3"]
    assert not [d for d in base + s3 if d.lower().startswith("torch")]


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




# --- what a new user meets: every named file, Flower's image, worker health, volumes ------

#: A compose file's name as the docs write it.
_COMPOSE_NAME = re.compile(r"docker-compose[\w.-]*\.ya?ml")


def test_every_compose_file_the_docs_name_exists_loads_and_matches_the_spec(
        tmp_path: Path) -> None:
    named: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named |= set(_COMPOSE_NAME.findall(doc.read_text()))
    assert {"docker-compose.yml", "docker-compose.cpu.yml"} <= named
    for name in sorted(named):
        path = ROOT / name
        assert path.is_file(), f"the docs name {name}, which does not exist"
        # Compose's own tags (!reset) parse; the spec sees their plain values.
        plain = strip_resets(load_compose(path))
        result = check_compose_schema(write_json(tmp_path, f"{name}.json", plain))
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"


def test_flower_runs_from_a_slim_image_without_torch() -> None:
    assert dockerfile_values(FLOWER_DOCKERFILE, "FROM") == ["python:3.11-slim"]
    runs = " ".join(dockerfile_values(FLOWER_DOCKERFILE, "RUN"))
    assert "'.[flower]'" in runs and "torch" not in runs
    with (ROOT / "pyproject.toml").open("rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["flower"]
    assert not [d for d in extra if "torch" in d.lower()]
    assert dockerfile_cmd(FLOWER_DOCKERFILE) == load_commands()["flower"]
    assert service("flower")["build"]["dockerfile"] == "ops/docker/flower.Dockerfile"
    assert k8s_container("carpool-flower")["image"] == "carpool-flower"
    users = dockerfile_values(FLOWER_DOCKERFILE, "USER")
    assert users and users[-1].isdigit() and users[-1] != "0"


def test_flowers_task_list_shows_each_batchs_args_and_result() -> None:
    columns = service("flower")["environment"]["FLOWER_TASKS_COLUMNS"].split(",")
    assert {"args", "result", "runtime", "worker"} <= set(columns)
    env = {e["name"]: e.get("value") for e in k8s_container("carpool-flower")["env"]}
    assert env["FLOWER_TASKS_COLUMNS"].split(",") == columns


def test_worker_healthcheck_pings_its_own_celery_node() -> None:
    test = service("worker")["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    argv = argv_of(test[1].split("|")[0])
    assert argv[:5] == ["celery", "-A", "worker.celery_app", "inspect", "ping"]
    # $$ is compose's escape for a literal $: the container's own hostname, the %h
    # that the worker's node name (worker@%h) expands.
    assert flag_value(argv, "-d") == "worker@$$HOSTNAME"
    assert "worker@%h" in load_commands()["worker"]
    assert grace_seconds(service("worker")["healthcheck"]["start_period"]) >= 120


def test_worker_keeps_calibration_profiles_on_a_volume_its_user_owns() -> None:
    folder = service("worker")["environment"]["CARPOOL_PROFILE_DIR"]
    assert folder.startswith("/")
    assert f"profiles:{folder}" in service("worker")["volumes"]
    assert "profiles" in compose()["volumes"]
    runs = " ".join(dockerfile_values(WORKER_DOCKERFILE, "RUN"))
    assert "-o carpool -g carpool" in runs and folder in runs  # owned by the image's user
    container = k8s_container("carpool-worker")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CARPOOL_PROFILE_DIR"] == folder
    assert folder in [m["mountPath"] for m in container["volumeMounts"]]


def test_gpu_workers_get_nvidia_smi_for_the_gpu_claim() -> None:
    caps = service("worker")["environment"]["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert {"compute", "utility"} <= set(caps)
    env = {e["name"]: e.get("value") for e in k8s_container("carpool-worker")["env"]}
    assert {"compute", "utility"} <= set(env["NVIDIA_DRIVER_CAPABILITIES"].split(","))


def test_catalogue_folder_is_mounted_in_web_and_workers_and_weights_in_workers() -> None:
    for name in ("web", "worker"):
        mounts = [str(v) for v in service(name).get("volumes", [])]
        assert any(m.endswith(":/etc/carpool:ro") for m in mounts), name
    assert any(str(m).endswith(":/models:ro") for m in service("worker")["volumes"])


def test_a_handler_package_beside_the_catalogue_is_importable_by_the_workers() -> None:
    # docs/operations.md: your handler package goes into the worker image, or beside the
    # catalogue; PYTHONPATH was nowhere set, and no host variable reached it.
    assert "/etc/carpool" in service("worker")["environment"]["PYTHONPATH"].split(":")
