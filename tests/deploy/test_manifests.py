"""The deployment files in deploy/ are checked like code: they parse, reference only things that exist, and agree
with each other and with the settings object.

Strategy: load every YAML document with `yaml.safe_load_all`, then check cross-references the way a cluster would
resolve them (Service selectors -> workload labels, secretKeyRef -> Secret keys, claimName -> PVC, compose
depends_on -> services), image names against the Dockerfile's targets and pyproject's version, and every
environment variable an upscale process receives against the fields of `orchestrator.settings.Settings`, including
building a `Settings` from it. Only the MLflow server and PostgreSQL, which are not upscale processes, may set other
variables, and only the ones they read."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from upscale.orchestrator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
IMAGES = {"api": "upscale/api", "worker": "upscale/worker"}  # Dockerfile target -> image repository
# Containers that are not upscale processes, with the only variables they may be given.
FOREIGN_ENV = {"postgres": {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "PGDATA"},
               "mlflow": {"MLFLOW_BACKEND_STORE_URI"}}
RAY_AUTH_ENV = {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}  # read by Ray itself, in every upscale process: token auth


def settings_env() -> dict[str, str]:
    """Environment variable name -> Settings field, as pydantic-settings reads them."""
    prefix = Settings.model_config["env_prefix"]
    out = {}
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        out[alias if isinstance(alias, str) else f"{prefix}{name}".upper()] = name
    return out


def k8s_docs() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d | {"__file__": path.name} for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == kind and "metadata" in d}


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def pod_specs() -> list[tuple[str, dict]]:
    """(owner, pod spec) for every pod template in the Kubernetes manifests, RayCluster groups included."""
    out = []
    for d in k8s_docs():
        if d["kind"] in ("Deployment", "StatefulSet"):
            out.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
        elif d["kind"] == "RayCluster":
            out.append(("ray-head", d["spec"]["headGroupSpec"]["template"]["spec"]))
            out += [(f"ray-{g['groupName']}", g["template"]["spec"]) for g in d["spec"]["workerGroupSpecs"]]
    return out


def k8s_env(container: dict) -> dict[str, str | dict]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def upscale_containers() -> list[tuple[str, dict[str, str | dict], list[str]]]:
    """(where, env, checkpoint-capable mount paths) of every container running upscale code (API and Ray nodes)."""
    out = []
    for owner, spec in pod_specs():
        for c in spec["containers"]:
            if c["image"].split(":")[0] in IMAGES.values() and c["name"] != "mlflow":
                mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
                out.append((f"k8s {owner}/{c['name']}", k8s_env(c), mounts))
    for name, svc in compose()["services"].items():
        if svc["image"].split(":")[0] in IMAGES.values() and name != "mlflow":
            mounts = [v.split(":")[1] for v in svc.get("volumes", [])]
            out.append((f"compose {name}", dict(svc.get("environment", {})), mounts))
    return out


def all_images() -> list[str]:
    images = [c["image"] for _, spec in pod_specs() for c in spec["containers"]]
    return images + [svc["image"] for svc in compose()["services"].values()]


# -- parsing and structure --------------------------------------------------------------------------------------


def test_every_manifest_parses_and_names_its_kind_and_namespace() -> None:
    files = sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 8
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
    for d in k8s_docs():
        assert d.get("apiVersion") and d.get("kind"), d["__file__"]
        if d["kind"] != "Kustomization":
            assert d["metadata"]["name"], d["__file__"]
        if d["kind"] not in ("Namespace", "Kustomization"):
            assert d["metadata"]["namespace"] == "upscale", f"{d['__file__']}: {d['kind']} {d['metadata']['name']}"


def test_kustomization_lists_exactly_the_manifest_files() -> None:
    resources = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(resources) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_required_kubernetes_objects_are_there() -> None:
    assert set(by_kind("Deployment")) == {"upscale-api", "upscale-mlflow"}
    assert {"upscale-api", "upscale-mlflow", "upscale-postgres"} <= set(by_kind("Service"))
    assert {"upscale-db", "upscale-api-tokens"} <= set(by_kind("Secret"))
    assert "upscale-checkpoints" in by_kind("PersistentVolumeClaim")
    assert by_kind("PersistentVolumeClaim")["upscale-checkpoints"]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_services_select_a_workload_and_target_a_named_port() -> None:
    workloads = [d for d in k8s_docs() if d["kind"] in ("Deployment", "StatefulSet")]
    for name, svc in by_kind("Service").items():
        matches = [w for w in workloads if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]
                   ["labels"].items()]
        assert len(matches) == 1, f"Service {name} selects {len(matches)} workloads"
        ports = {p["name"] for c in matches[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name} targets {port['targetPort']}, pods have {ports}"
    for w in workloads:
        assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()


def test_secret_and_volume_references_resolve() -> None:
    secrets = {name: set(s.get("stringData", {})) | set(s.get("data", {})) for name, s in by_kind("Secret").items()}
    claims = set(by_kind("PersistentVolumeClaim"))
    configmaps = set(by_kind("ConfigMap"))
    for owner, spec in pod_specs():
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], f"{owner}: {ref} missing"
            for m in c.get("volumeMounts", []):
                if owner == "upscale-postgres" and m["name"] == "data":
                    continue  # from the StatefulSet's volumeClaimTemplates
                v = volumes[m["name"]]
                if "persistentVolumeClaim" in v:
                    assert v["persistentVolumeClaim"]["claimName"] in claims
                if "configMap" in v:
                    assert v["configMap"]["name"] in configmaps
            for arg in c.get("args", []):  # $(VAR) in args must be a variable of the container
                for var in re.findall(r"\$\((\w+)\)", arg):
                    assert var in k8s_env(c), f"{owner}: args use $({var}) which is not in env"


def test_raycluster_has_cpu_and_gpu_groups_on_the_pinned_ray() -> None:
    (cluster,) = by_kind("RayCluster").values()
    ray_pin = next(d for d in PYPROJECT["project"]["optional-dependencies"]["worker"] if d.startswith("ray["))
    assert cluster["spec"]["rayVersion"] == ray_pin.split("==")[1]
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    for g in groups.values():
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == groups["gpu"]["rayStartParams"]["num-gpus"] == "1"
    assert "nvidia.com/gpu" not in str(groups["cpu"])
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # segments never land on the head


def test_compose_services_have_health_checks_and_valid_dependencies() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "mlflow", "ray-head", "ray-worker", "api"}
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services and cond["condition"] == "service_healthy"
            assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health, which has no check"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            assert (source.startswith("./") and (DEPLOY / source).is_file()) or source in compose()["volumes"]
    assert "healthcheck" in services["api"] and "healthcheck" in services["mlflow"]


# -- images -----------------------------------------------------------------------------------------------------


def test_images_are_the_dockerfile_targets_at_the_package_version() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\w+)$", dockerfile, re.M))
    assert set(IMAGES) <= targets
    ours = [i for i in all_images() if i.startswith("upscale/")]
    assert {i.split(":")[0] for i in ours} == set(IMAGES.values())
    for image in ours:
        assert re.fullmatch(rf"upscale/(api|worker):{re.escape(VERSION)}(-cuda)?", image), image
    for name, svc in compose()["services"].items():
        if "build" in svc:
            assert svc["image"].split(":")[0] == IMAGES[svc["build"]["target"]], name
            assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
    foreign = [i for i in all_images() if not i.startswith("upscale/")]
    assert foreign and all(re.fullmatch(r"postgres:\d+\.\d+-\w+", i) for i in foreign)  # pinned, same everywhere
    assert len(set(foreign)) == 1


def test_dockerfile_pins_python_and_torch_as_the_makefile() -> None:
    # pyproject admits a torch range (a GPU machine keeps its CUDA build); the image pins the CPU wheel `make` installs
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    make_pin = re.search(r"pip install -q torch==([\d.]+)", (ROOT / "Makefile").read_text()).group(1)
    assert f"ARG TORCH_VERSION={make_pin}\n" in dockerfile
    torch_range = next(d for d in PYPROJECT["project"]["optional-dependencies"]["worker"] if d.startswith("torch"))
    floor = re.fullmatch(r"torch>=([\d.]+)", torch_range).group(1)
    assert tuple(map(int, make_pin.split("."))) >= tuple(map(int, floor.split(".")))
    assert "python:3.11-slim" in dockerfile and PYPROJECT["project"]["requires-python"].startswith(">=3.11")
    assert 'pip install ".[worker]"' in dockerfile
    assert "--index-url" in dockerfile and "download.pytorch.org/whl/cpu" in dockerfile
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        assert f"COPY {folder} ./{folder}\n" in dockerfile  # every folder the wheel maps is in the image


def test_the_image_can_open_s3_checkpoint_uris() -> None:
    # UPSCALE_CHECKPOINT_DIR may be an fsspec URI (upscale/storage.py): fsspec is a worker dependency, and the image
    # installs the S3 protocol's package in the same pip command (so pip picks an s3fs matching that fsspec)
    assert any(re.match(r"fsspec\b", d) for d in PYPROJECT["project"]["optional-dependencies"]["worker"])
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r'^RUN pip install "\.\[worker\]" "s3fs[=<>~]=?[\d.]+"', dockerfile, re.M)


# -- settings ---------------------------------------------------------------------------------------------------


def test_upscale_processes_get_only_settings_fields_and_every_one_they_need() -> None:
    names = settings_env()
    containers = upscale_containers()
    assert len(containers) == 7  # k8s: api, ray head, cpu and gpu groups; compose: api, ray-head, ray-worker
    for where, env, mounts in containers:
        unknown = set(env) - set(names) - RAY_AUTH_ENV
        assert not unknown, f"{where} sets {unknown}, which are not fields of Settings ({sorted(names)})"
        needed = set(names) - ({"RAY_ADDRESS"} if "ray" in where else set())  # Ray nodes are the cluster
        assert needed <= set(env), f"{where} leaves {needed - set(env)} to a local default"
        assert env["UPSCALE_CHECKPOINT_DIR"] in mounts, f"{where}: checkpoints are not on the shared volume"
        if all(isinstance(v, str) for v in env.values()):  # compose: the values themselves build Settings
            s = Settings(**{names[k]: v for k, v in env.items() if k not in RAY_AUTH_ENV})
            assert s.db_url.startswith("postgresql+psycopg://") and s.mlflow_tracking_uri.startswith("http://")


def test_the_ray_cluster_and_its_clients_use_token_authentication_and_the_dashboard_is_not_open() -> None:
    secrets = by_kind("Secret")
    for where, env, _ in upscale_containers():  # every Ray node, and the API that drives the cluster
        assert env.get("RAY_AUTH_MODE") == "token", where
        token = env.get("RAY_AUTH_TOKEN")
        if where.startswith("k8s"):
            ref = token["secretKeyRef"]
            assert ref["key"] in secrets[ref["name"]]["stringData"], where
        else:  # compose: from deploy/.env, required (no default token anyone could read here)
            assert re.fullmatch(r"\$\{RAY_AUTH_TOKEN:\?[^}]+\}", token), where
    assert "RAY_AUTH_TOKEN=" in (DEPLOY / ".env.example").read_text()
    (cluster,) = by_kind("RayCluster").values()
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"].get("dashboard-host") == "127.0.0.1"  # Ray's default would be every interface
    assert 8265 not in [p["containerPort"] for c in head["template"]["spec"]["containers"] for p in c["ports"]]
    ray_head = compose()["services"]["ray-head"]
    assert all(p.startswith("127.0.0.1:") for p in ray_head.get("ports", []))  # the dashboard: loopback only


def test_foreign_containers_get_only_their_own_variables() -> None:
    for owner, spec in pod_specs():
        for c in spec["containers"]:
            if c["name"] in FOREIGN_ENV:
                assert set(k8s_env(c)) <= FOREIGN_ENV[c["name"]], owner
    for name in FOREIGN_ENV:
        assert set(compose()["services"][name].get("environment", {})) <= FOREIGN_ENV[name]


def test_addresses_point_at_services_that_exist_on_their_ports() -> None:
    services = compose()["services"]
    for where, env, _ in upscale_containers():
        mlflow = urlsplit(env["MLFLOW_TRACKING_URI"])
        if where.startswith("compose"):
            assert mlflow.hostname in services and f"--port={mlflow.port}" in services["mlflow"]["command"]
            if "RAY_ADDRESS" in env:
                ray = urlsplit(env["RAY_ADDRESS"])
                assert ray.scheme == "ray" and ray.hostname in services
                assert f"--ray-client-server-port={ray.port}" in services[ray.hostname]["command"]
        else:
            svc = by_kind("Service")[mlflow.hostname]
            assert mlflow.port in [p["port"] for p in svc["spec"]["ports"]]
            if "RAY_ADDRESS" in env:
                ray = urlsplit(env["RAY_ADDRESS"])
                (cluster,) = by_kind("RayCluster")
                assert ray.scheme == "ray" and ray.hostname == f"{cluster}-head-svc" and ray.port == 10001
    # the MLflow server accepts the Host header its clients send (MLflow 3's DNS-rebinding check)
    assert "--allowed-hosts=mlflow,mlflow:*" in " ".join(services["mlflow"]["command"])
    args = " ".join(by_kind("Deployment")["upscale-mlflow"]["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "upscale-mlflow:*" in args


@pytest.mark.parametrize("key", ["UPSCALE_DB_URL", "mlflow-backend-store-uri"])
def test_database_urls_use_the_installed_driver_and_the_postgres_service(key: str) -> None:
    url = urlsplit(by_kind("Secret")["upscale-db"]["stringData"][key])
    assert url.scheme == "postgresql+psycopg" and url.hostname in by_kind("Service")
    assert any(d.startswith("psycopg[binary]") for d in PYPROJECT["project"]["optional-dependencies"]["worker"])


def test_the_api_command_the_manifests_run_exists_with_those_options() -> None:
    import typer

    from upscale.api.cli import app

    click = typer.main.get_command(app)
    serve = click.commands["serve"]
    options = {o for p in serve.params for o in p.opts}
    api_target = (DEPLOY / "Dockerfile").read_text().split(" AS api\n")[1]
    commands = [re.search(r"^CMD (\[.*\])$", api_target, re.M).group(1)]  # compose's api runs the image's CMD
    assert "command" not in compose()["services"]["api"]
    commands.append(by_kind("Deployment")["upscale-api"]["spec"]["template"]["spec"]["containers"][0]["command"])
    for command in commands:
        argv = yaml.safe_load(command) if isinstance(command, str) else command
        assert argv[:2] == ["upscale", "serve"], argv
        assert {a for a in argv[2:] if a.startswith("--")} <= options, (argv, options)
        assert argv[argv.index("--host") + 1] == "0.0.0.0"  # reachable from outside its container
    assert "create" in click.commands["token"].commands and "submit" in click.commands  # deploy/README.md step 6


def test_the_deploy_readme_documents_exactly_the_settings() -> None:
    table = re.findall(r"^\| `(\w+)` \|", (DEPLOY / "README.md").read_text(), re.M)
    assert sorted(table) == sorted(settings_env())
