"""deploy/: the image definition, the KServe runtime and the Kubernetes manifests, checked as far as this machine can.

No Docker engine or cluster exists here, so: every manifest validates against the schemas its API server would
use (Kubernetes' own, shipped by kubernetes-validate; KServe's CRDs from ../shared); the Dockerfile is parsed with
BuildKit's parser and its promises checked; and the commands the manifests and the image run are run for real —
`workbench serve` with the runtime's exact arguments, `workbench-entrypoint` with the Deployment's — and probed
and queried the way the cluster would, on 127.0.0.1.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dockerfile
import jsonschema
import kubernetes_validate
import pytest
import requests
import yaml
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2
from waiting import free_port, wait_until

from workbench.cli import build_parser
from workbench.deploy.entrypoint import DEFAULT_MODEL_BASE_PATH, DEFAULT_MODEL_NAME, IMAGE_DEFAULTS, serve_arguments
from workbench.deploy.manifests import MANAGEMENT_SECRET

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# KServe's CRD schemas: beside the repository in CI (../shared), absent from a user's clone.
KSERVE_SCHEMAS = ROOT.parent / "shared" / "testdata" / "kserve"
KSERVE_GROUP = "serving.kserve.io"
# The oldest Kubernetes that kubernetes-validate ships schemas for: manifests valid there use nothing newer.
KUBERNETES_VERSION = "1.34.0"
# The console scripts of the environment running the tests (make install puts workbench's there).
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 240.0  # TensorFlow's import and a model load, in a process of its own, on a loaded 2-core machine
STOP_TIMEOUT_S = 90.0


# ------------------------------------------------------------------------------------------------ the manifests
@dataclass(frozen=True)
class Manifest:
    path: Path
    document: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(DEPLOY)}:{self.document['kind']}"

    @property
    def group(self) -> str:
        api_version: str = self.document["apiVersion"]
        return api_version.rpartition("/")[0]


def load_manifests() -> list[Manifest]:
    found = [
        Manifest(path, document)
        for path in sorted(DEPLOY.rglob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document is not None
    ]
    assert found, f"no manifests under {DEPLOY}"
    return found


MANIFESTS = load_manifests()
KUSTOMIZATIONS = [m for m in MANIFESTS if m.document["kind"] == "Kustomization"]
KSERVE = [m for m in MANIFESTS if m.group == KSERVE_GROUP]
KEDA_GROUP = "keda.sh"
KEDA = [m for m in MANIFESTS if m.group == KEDA_GROUP]
BUILT_IN = [m for m in MANIFESTS if m not in KSERVE and m not in KUSTOMIZATIONS and m not in KEDA]
# KEDA's ScaledObject as keda.sh documents it (v2: spec.scaleTargetRef, replica counts, periods, triggers with
# their type, metadata and metricType), strict: a field KEDA does not read (a typo) is an error here, as it would
# be silently ignored in a cluster. No CRD schema of KEDA's is available offline.
KEDA_SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "advanced": {"type": "object"},
                "fallback": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "authenticationRef": {"type": "object"},
                            "useCachedMetrics": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def only(kind: str, folder: str | None = None) -> Manifest:
    """The one manifest of ``kind`` under deploy/ (under ``deploy/FOLDER`` when given)."""
    matches = [
        m for m in MANIFESTS if m.document["kind"] == kind and (folder is None or m.path.parent == DEPLOY / folder)
    ]
    assert len(matches) == 1, f"expected one {kind} under deploy/, found {[m.id for m in matches]}"
    return matches[0]


def the_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec["containers"]
    assert len(containers) == 1, containers
    return containers[0]  # type: ignore[no-any-return]


def flag_value(args: list[str], name: str) -> str:
    values = [word.split("=", 1)[1] for word in args if word.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} given {len(values)} times in {args}"
    return values[0]


def replace_flag(args: list[str], name: str, value: object) -> list[str]:
    return [f"--{name}={value}" if word.startswith(f"--{name}=") else word for word in args]


@pytest.mark.parametrize("manifest", BUILT_IN, ids=lambda m: m.id)
def test_built_in_kinds_validate_against_kubernetes_schemas(manifest: Manifest) -> None:
    # strict: a field Kubernetes does not know (a typo such as `readinessprobe`) is an error, not silently dropped.
    kubernetes_validate.validate(manifest.document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("manifest", KEDA, ids=lambda m: m.id)
def test_keda_kinds_validate_against_kedas_documented_fields(manifest: Manifest) -> None:
    validator = jsonschema.Draft202012Validator(KEDA_SCALED_OBJECT)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest.document)]
    assert not errors, errors
    # It scales the Deployment deploy/kubernetes makes.
    assert manifest.document["spec"]["scaleTargetRef"]["name"] == only("Deployment").document["metadata"]["name"]
    broken = copy.deepcopy(manifest.document)
    broken["spec"]["maxReplicas"] = broken["spec"].pop("maxReplicaCount")
    assert any("maxReplicas" in e.message for e in validator.iter_errors(broken))


def test_the_kubernetes_validator_rejects_a_broken_deployment() -> None:
    """The check above can fail: a misspelt field and a wrong type are both caught, offline."""
    broken = copy.deepcopy(only("Deployment").document)
    container = the_container(broken["spec"]["template"]["spec"])
    container["readinessprobe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessprobe"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    broken = copy.deepcopy(only("Deployment").document)
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError, match="two"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def kserve_validator(document: dict[str, Any]) -> jsonschema.Draft4Validator:
    if not KSERVE_SCHEMAS.is_dir():
        pytest.skip(f"KServe's CRD schemas are not here ({KSERVE_SCHEMAS}: ../shared is absent outside CI)")
    schema = json.loads((KSERVE_SCHEMAS / f"{document['kind']}.schema.json").read_text())
    assert schema["group"] == KSERVE_GROUP
    return jsonschema.Draft4Validator(schema["versions"][document["apiVersion"].split("/")[1]])


@pytest.mark.parametrize("manifest", KSERVE, ids=lambda m: m.id)
def test_kserve_kinds_validate_against_the_crd_schemas(manifest: Manifest) -> None:
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in kserve_validator(manifest.document).iter_errors(manifest.document)
    ]
    assert errors == []


def test_the_crd_schema_rejects_a_broken_runtime() -> None:
    broken = copy.deepcopy(only("ClusterServingRuntime", "kserve").document)
    broken["spec"]["supportedModelFormats"][0]["priority"] = 0  # KServe's minimum is 1
    broken["spec"]["containers"][0]["args"] = "--port=9000"  # a string, not a list
    messages = [e.message for e in kserve_validator(broken).iter_errors(broken)]
    assert any("minimum" in m for m in messages) and any("is not of type 'array'" in m for m in messages), messages


def test_the_kserve_kinds_are_the_ones_kserve_knows() -> None:
    assert {(m.document["apiVersion"], m.document["kind"]) for m in KSERVE} == {
        ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"),
        ("serving.kserve.io/v1beta1", "InferenceService"),
    }


def test_the_inference_service_uses_the_runtime_with_a_canary_from_s3() -> None:
    runtime = only("ClusterServingRuntime", "kserve").document
    predictor = only("InferenceService", "kserve").document["spec"]["predictor"]
    assert predictor["model"]["runtime"] == runtime["metadata"]["name"] == "workbench"
    assert 0 < predictor["canaryTrafficPercent"] < 100
    assert predictor["model"]["storageUri"].startswith("s3://")
    format_ = predictor["model"]["modelFormat"]
    assert {"name": format_["name"], "version": format_["version"]} in [
        {"name": f["name"], "version": f["version"]} for f in runtime["spec"]["supportedModelFormats"]
    ]
    assert predictor["model"]["protocolVersion"] in runtime["spec"]["protocolVersions"]
    # The ServiceAccount that carries the S3 credentials is one of deploy/'s manifests.
    accounts = [m.document["metadata"]["name"] for m in MANIFESTS if m.document["kind"] == "ServiceAccount"]
    assert predictor["serviceAccountName"] in accounts


def test_the_runtime_follows_kserve_conventions() -> None:
    spec = only("ClusterServingRuntime", "kserve").document["spec"]
    formats = {(f["name"], f["version"]) for f in spec["supportedModelFormats"]}
    assert formats == {("tensorflow", "1"), ("tensorflow", "2"), ("workbench", "1")}
    # TF Serving's API and the Open Inference Protocol, over REST and gRPC: KServe's names for them.
    assert set(spec["protocolVersions"]) == {"v1", "v2", "grpc-v1", "grpc-v2"}
    container = the_container(spec)
    assert container["name"] == "kserve-container"  # where KServe puts storageUri's model and its settings
    args = container["args"]
    for convention in (
        "--model_name={{.Name}}",
        "--port=9000",
        "--rest_api_port=8080",
        "--model_base_path=/mnt/models",
    ):
        assert convention in args
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
    # Prometheus scrapes the REST port: the annotations, the probes and the flag name one port.
    rest_port = int(flag_value(args, "rest_api_port"))
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == rest_port
    assert container["readinessProbe"]["httpGet"]["port"] == container["livenessProbe"]["httpGet"]["port"] == rest_port


# What KServe's own kserve-mlserver runtime declares (config/runtimes/kserve-mlserver.yaml): its formats and versions.
KSERVE_MLSERVER_FORMATS = {
    ("sklearn", "0"), ("sklearn", "1"), ("xgboost", "1"), ("xgboost", "2"),
    ("lightgbm", "3"), ("lightgbm", "4"), ("mlflow", "1"), ("mlflow", "2"),
}  # fmt: skip


def test_the_mlserver_runtime_stands_in_for_kserve_mlserver() -> None:
    """Every format kserve-mlserver serves, auto-selectable below its priority, with the server type that has KServe
    hand the container MLServer's environment, and the ports and variables kserve-mlserver's container reads."""
    runtime = only("ClusterServingRuntime", "kserve-mlflow").document
    assert runtime["metadata"]["annotations"]["serving.kserve.io/server-type"] == "mlserver"
    spec = runtime["spec"]
    formats = {(f["name"], f["version"]) for f in spec["supportedModelFormats"]}
    assert formats >= KSERVE_MLSERVER_FORMATS
    assert all(f["autoSelect"] and f["priority"] == 1 for f in spec["supportedModelFormats"])
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    container = the_container(spec)
    assert container["name"] == "kserve-container"
    assert container["command"] == ["workbench", "mlserver", "start", "/mnt/models"]
    env = secret_env(container, {})
    assert env["MLSERVER_MODEL_IMPLEMENTATION"] == "{{.Labels.modelClass}}"
    assert (env["MLSERVER_HTTP_PORT"], env["MLSERVER_GRPC_PORT"]) == ("8080", "9000")
    rest_port = int(env["MLSERVER_HTTP_PORT"])
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == rest_port
    assert container["readinessProbe"]["httpGet"]["port"] == container["livenessProbe"]["httpGet"]["port"] == rest_port
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["capabilities"]["drop"] == ["ALL"]
    service = only("InferenceService", "kserve-mlflow").document["spec"]["predictor"]["model"]
    assert service["runtime"] == runtime["metadata"]["name"]
    assert (service["modelFormat"]["name"], service["modelFormat"]["version"]) in formats
    assert service["protocolVersion"] in spec["protocolVersions"]


def test_the_kustomization_names_every_manifest_of_its_folder() -> None:
    (kustomization,) = KUSTOMIZATIONS
    folder = kustomization.path.parent
    listed = kustomization.document["resources"]
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.yaml") if p != kustomization.path)
    image = the_container(only("Deployment").document["spec"]["template"]["spec"])["image"]
    assert {entry["name"] for entry in kustomization.document["images"]} == {image.rsplit(":", 1)[0]}


def test_the_deployment_drains_within_its_grace_period() -> None:
    pod = only("Deployment").document["spec"]["template"]["spec"]
    container = the_container(pod)
    drain_s = float(flag_value(container["args"], "drain_seconds"))
    # Not ready, yet taking connections while endpoints update: a part of the drain, not added to it.
    assert 0 < float(flag_value(container["args"], "drain_delay_seconds")) < drain_s
    assert "lifecycle" not in container  # no preStop: the grace period's clock starts with SIGTERM itself
    assert pod["terminationGracePeriodSeconds"] >= drain_s + 10  # the drain, and time to exit after it


def test_the_service_exposes_the_deployments_ports_by_name() -> None:
    container = the_container(only("Deployment").document["spec"]["template"]["spec"])
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container_ports == {"grpc": 8500, "http": 8501}
    assert IMAGE_DEFAULTS[:2] == ("--port=8500", "--rest_api_port=8501")  # what the image's entrypoint binds
    service = only("Service").document["spec"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["ports"]} == {
        "grpc": (8500, "grpc"),
        "http": (8501, "http"),
    }
    deployment = only("Deployment").document
    assert service["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    hpa = only("HorizontalPodAutoscaler").document["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["maxReplicas"]


# ------------------------------------------------------------------------------------------- the image's command
def serve_namespace(args: list[str]) -> Any:
    """What `workbench serve` makes of ``args``: its own parser, so "a later flag wins" is its behaviour, not ours."""
    return build_parser().parse_args(["serve", *args])


def test_the_entrypoint_serves_model_name_from_model_base_path_on_every_address() -> None:
    parsed = serve_namespace(serve_arguments([], {}))
    assert (parsed.model_name, parsed.model_base_path) == (DEFAULT_MODEL_NAME, f"{DEFAULT_MODEL_BASE_PATH}/model")
    assert (parsed.port, parsed.rest_api_port, parsed.host) == (8500, 8501, "0.0.0.0")
    parsed = serve_namespace(serve_arguments([], {"MODEL_NAME": "digits", "MODEL_BASE_PATH": "/srv/models/"}))
    assert (parsed.model_name, parsed.model_base_path) == ("digits", "/srv/models/digits")


def test_the_entrypoint_appends_arguments_and_the_later_flag_wins() -> None:
    args = serve_arguments(["--rest_api_port=9001", "--host", "127.0.0.1", "--enable_batching"], {"MODEL_NAME": "a"})
    parsed = serve_namespace(args)
    assert (parsed.port, parsed.rest_api_port, parsed.host, parsed.enable_batching) == (8500, 9001, "127.0.0.1", True)
    assert parsed.model_name == "a"


@pytest.mark.parametrize(
    "source",
    [
        ["--model_config_file=/etc/models.config"],
        ["--model_config_file", "/etc/models.config"],
        ["--model-config-file=/etc/models.config"],
        ["--model_repository=/srv/models"],
        ["--repo=/srv/models"],  # an earlier spelling `workbench serve` still takes
    ],
)
def test_the_entrypoint_stays_out_of_the_way_of_a_model_source(source: list[str]) -> None:
    args = serve_arguments(source, {"MODEL_NAME": "ignored", "MODEL_BASE_PATH": "/nowhere"})
    assert not any("ignored" in word or "/nowhere" in word for word in args), args
    parsed = serve_namespace(args)
    assert parsed.model_config_file or parsed.model_repository
    assert parsed.model_base_path == ""  # one model source: `workbench serve` would refuse two


def test_a_model_base_path_argument_keeps_model_name() -> None:
    """As in the tensorflow/serving image: the path is replaced, the name stays $MODEL_NAME."""
    parsed = serve_namespace(serve_arguments(["--model_base_path=/data/hp"], {"MODEL_NAME": "hp"}))
    assert (parsed.model_name, parsed.model_base_path) == ("hp", "/data/hp")
    parsed = serve_namespace(serve_arguments(["--model_base_path=/data/hp", "--model_name=other"], {}))
    assert (parsed.model_name, parsed.model_base_path) == ("other", "/data/hp")


# ------------------------------------------------------------------------------------------- the Dockerfile
@dataclass(frozen=True)
class Stage:
    image: str
    name: str
    commands: tuple[dockerfile.Command, ...]

    def all(self, instruction: str) -> list[dockerfile.Command]:
        return [c for c in self.commands if c.cmd == instruction]


def dockerfile_stages(path: Path) -> list[Stage]:
    """The build stages of ``path``, each with its base image (global ARG defaults substituted) and commands."""
    commands = dockerfile.parse_file(str(path))
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    current: list[dockerfile.Command] = []
    for command in commands:
        if command.cmd == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], command.value[0])
            name = command.value[2] if len(command.value) == 3 and command.value[1].upper() == "AS" else ""
            current = []
            stages.append(Stage(image, name, ()))
        elif not stages and command.cmd == "ARG":
            key, _, default = command.value[0].partition("=")
            global_args[key] = default
        if stages:
            current.append(command)
            stages[-1] = Stage(stages[-1].image, stages[-1].name, tuple(current))
    return stages


STAGES = dockerfile_stages(DEPLOY / "Dockerfile")


def project() -> dict[str, Any]:
    """pyproject.toml, read with tomllib (Python 3.11+; on 3.10 the tests that need it skip)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())  # type: ignore[no-any-return]


def test_the_image_is_built_in_one_stage_and_installed_in_a_slim_other() -> None:
    assert len(STAGES) == 2
    build, final = STAGES
    assert build.name and final.image == "python:3.11-slim"
    wheel_builds = [" ".join(c.value) for c in build.all("RUN") if "pip wheel" in " ".join(c.value)]
    assert len(wheel_builds) == 1, "the build stage makes the wheel with pip wheel"
    wheel_dir = re.search(r"--wheel-dir[= ](\S+)", wheel_builds[0])
    assert wheel_dir, wheel_builds[0]
    # The final stage takes nothing from the build context, and only the wheel from the build stage.
    assert final.all("ADD") == []
    copies = final.all("COPY")
    assert copies and all(c.flags == (f"--from={build.name}",) for c in copies), copies
    sources = [source for c in copies for source in c.value[:-1]]
    assert all(s.startswith(wheel_dir.group(1).rstrip("/") + "/") and s.endswith(".whl") for s in sources), sources
    installs = " ".join(" ".join(c.value) for c in final.all("RUN"))
    assert "pip install" in installs and "apt-get" not in installs  # no compilers, no Node.js


def test_the_image_runs_as_a_non_root_user() -> None:
    users = STAGES[-1].all("USER")
    assert users, "the final stage sets USER"
    uid = users[-1].value[0].split(":")[0]
    assert uid.isdigit() and int(uid) == 1000  # numeric, so Kubernetes' runAsNonRoot can check it


def test_the_image_exposes_tf_servings_ports_and_runs_the_entrypoint() -> None:
    final = STAGES[-1]
    assert {port for c in final.all("EXPOSE") for port in c.value} == {"8500", "8501"}
    (entrypoint,) = final.all("ENTRYPOINT")
    assert entrypoint.json, "exec form, so that the server is PID 1 and gets the signals"
    scripts = project()["project"]["scripts"]
    assert scripts.get(entrypoint.value[0]) == "workbench.deploy.entrypoint:main"
    environment = {}
    for command in final.all("ENV"):
        environment.update(zip(command.value[::2], command.value[1::2], strict=True))
    assert environment["MODEL_NAME"] == DEFAULT_MODEL_NAME
    assert environment["MODEL_BASE_PATH"] == DEFAULT_MODEL_BASE_PATH
    (healthcheck,) = final.all("HEALTHCHECK")
    assert "http://127.0.0.1:8501/healthz" in " ".join(healthcheck.value)


def test_the_build_context_holds_what_the_wheel_is_built_from() -> None:
    """The ignore file beside the Dockerfile re-admits every path pyproject.toml builds the wheel from."""
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", "everything else (.venv, node_modules, dist) stays out of the context"
    admitted = {p[1:] for p in patterns if p.startswith("!")}
    pyproject = project()
    hatch = pyproject["tool"]["hatch"]["build"]
    needed = {"pyproject.toml", pyproject["project"]["readme"], *hatch["targets"]["wheel"]["packages"]}
    needed |= {source.split("/")[0] for source in hatch["targets"]["wheel"]["shared-data"]}
    needed.add(hatch["hooks"]["jupyter-builder"]["build-kwargs"]["path"])
    assert needed - {"workbench/labextension"} <= admitted | {"workbench"}, needed - admitted
    assert "workbench/labextension" in patterns  # built in the image (production build), never the host's


# ------------------------------------------------------------------------------------------- real processes


class Process:
    """A console script of this environment, run as the container would run it, its output in a file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        executable = BIN / argv[0]
        assert executable.exists(), f"{executable} is missing: reinstall the project (make install)"
        environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {}))
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(executable), *argv[1:]],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def get(self, url: str) -> requests.Response | None:
        """GET ``url``; None while nothing listens. Fails the test at once if the process has ended."""
        if self.proc.poll() is not None:
            pytest.fail(f"the server exited with {self.proc.returncode}:\n{self.output()}")
        try:
            return requests.get(url, timeout=10)
        except requests.ConnectionError:
            return None

    def status(self, url: str) -> int:
        """The HTTP status of a GET of ``url``, which must answer."""
        response = self.get(url)
        assert response is not None, f"nothing listens at {url}"
        return response.status_code

    def wait_for(
        self, url: str, accept: Callable[[requests.Response], bool] = lambda r: r.status_code == 200
    ) -> requests.Response:
        """Poll ``url`` as a probe does until it answers 200 (or what ``accept`` accepts)."""

        def ok() -> requests.Response | None:
            response = self.get(url)
            return response if response is not None and accept(response) else None

        try:
            return wait_until(ok, timeout=START_TIMEOUT_S, interval=0.2, what=f"200 from {url}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nserver output:\n{self.output()}") from None

    def stop(self) -> int:
        """SIGTERM, as the kubelet sends; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            pytest.fail(f"the server did not stop within {STOP_TIMEOUT_S} s of SIGTERM:\n{self.output()}")


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[Process] = []

    def run(argv: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(argv, tmp_path / f"server-{len(started)}.log", env)
        started.append(process)
        return process

    yield run
    for process in started:
        if process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait(timeout=30)


def secret_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet fills it from ``secrets`` (name → key → value)."""
    env = {}
    for entry in container.get("env", []):
        ref = entry["valueFrom"]["secretKeyRef"] if "valueFrom" in entry else None
        if ref is None:
            env[entry["name"]] = entry["value"]
        elif ref["name"] in secrets:
            env[entry["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def http_probe(container: dict[str, Any], probe: str, ports: dict[object, int]) -> str:
    """The URL a kubelet would GET for ``probe``, its port (a number or a port's name) mapped through ``ports``."""
    get = container[probe]["httpGet"]
    return f"http://127.0.0.1:{ports[get['port']]}{get['path']}"


def predict_half_plus_two(rest_port: int, model: str) -> None:
    url = f"http://127.0.0.1:{rest_port}/v1/models/{model}:predict"
    response = requests.post(url, json={"instances": [1.0, 2.0, 5.0]}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": [2.5, 3.0, 4.5]}


def test_the_kserve_runtime_arguments_serve_and_answer_its_probes(
    start: Any, tmp_path: Path, model_store: Path
) -> None:
    """`workbench serve` with exactly the runtime's container arguments, as KServe templates and mounts them."""
    runtime = only("ClusterServingRuntime", "kserve").document
    container = the_container(runtime["spec"])
    # KServe's storage initializer leaves storageUri's contents in /mnt/models: here, one version of half_plus_two.
    mnt_models = tmp_path / "mnt-models"
    shutil.copytree(model_store / "hp2_tf2", mnt_models / "1")
    rest_port, grpc_port = free_port(), free_port()
    declared_rest_port = int(flag_value(container["args"], "rest_api_port"))
    args = [
        word.replace("{{.Name}}", "half_plus_two").replace("/mnt/models", str(mnt_models)) for word in container["args"]
    ]
    args = replace_flag(replace_flag(args, "rest_api_port", rest_port), "port", grpc_port)
    assert "{{" not in " ".join(args), "KServe templates only {{.Name}} here"

    # Bound on every address, the server starts only with a management token: the Secret the env names.
    refused = subprocess.run(
        [str(BIN / container["command"][0]), *container["command"][1:], *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "WORKBENCH_MANAGEMENT_TOKEN"},
    )
    assert refused.returncode == 2 and "--management_token" in refused.stderr, refused.stderr
    token = "s3cret-from-the-secret"
    server = start([*container["command"], *args], env=secret_env(container, {MANAGEMENT_SECRET: {"token": token}}))
    ports = {declared_rest_port: rest_port}
    ready = server.wait_for(http_probe(container, "readinessProbe", ports))
    assert ready.status_code == 200
    assert server.status(http_probe(container, "livenessProbe", ports)) == 200
    predict_half_plus_two(rest_port, "half_plus_two")
    load = f"http://127.0.0.1:{rest_port}/workbench/v1/models/half_plus_two/versions/1:load"
    assert requests.post(load, timeout=30).status_code == 401
    authorized = requests.post(load, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert authorized.status_code == 200, authorized.text
    assert token not in server.output()

    # Where the runtime's annotations send Prometheus, metrics in its text format, this request counted.
    annotations = runtime["spec"]["annotations"]
    metrics_port = ports[int(annotations["prometheus.kserve.io/port"])]
    metrics = requests.get(f"http://127.0.0.1:{metrics_port}{annotations['prometheus.kserve.io/path']}", timeout=10)
    assert metrics.status_code == 200, metrics.text
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "# TYPE" in metrics.text and "half_plus_two" in metrics.text

    assert server.stop() == 0, server.output()


def test_the_mlserver_runtime_serves_an_mlflow_model_from_the_environment_kserve_gives_it(
    start: Any, tmp_path: Path
) -> None:
    """The workbench-mlserver container as KServe starts it for an MLflow InferenceService: its command and
    environment, plus what KServe adds for a runtime of server type mlserver (the model's name and /mnt/models) and
    the modelClass label it sets for the mlflow format."""
    import mlflow.sklearn
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    runtime = only("ClusterServingRuntime", "kserve-mlflow").document
    container = the_container(runtime["spec"])
    iris = load_iris(as_frame=True)
    model = LogisticRegression(max_iter=500).fit(iris.data, iris.target)
    mnt_models = tmp_path / "mnt-models"  # storageUri's contents: the logged model's folder
    mlflow.sklearn.save_model(model, mnt_models, input_example=iris.data.head(2))
    rest_port, grpc_port = free_port(), free_port()
    env = secret_env(container, {MANAGEMENT_SECRET: {"token": "from-the-secret"}})
    env |= {
        "MLSERVER_MODEL_IMPLEMENTATION": "mlserver_mlflow.MLflowRuntime",  # {{.Labels.modelClass}} for mlflow
        "MLSERVER_MODEL_NAME": "wine",
        "MLSERVER_MODEL_URI": str(mnt_models),
        "MLSERVER_HTTP_PORT": str(rest_port),
        "MLSERVER_GRPC_PORT": str(grpc_port),
    }
    command = [word.replace("/mnt/models", str(mnt_models)) for word in container["command"]]
    server = start(command, env=env)
    ports = {int(secret_env(container, {})["MLSERVER_HTTP_PORT"]): rest_port}
    server.wait_for(http_probe(container, "readinessProbe", ports))
    assert server.status(http_probe(container, "livenessProbe", ports)) == 200
    rows = iris.data.head(3)
    body = {
        "inputs": [
            {"name": column, "shape": [3], "datatype": "FP64", "data": rows[column].tolist()} for column in rows.columns
        ]
    }
    answer = requests.post(f"http://127.0.0.1:{rest_port}/v2/models/wine/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["data"] == model.predict(rows).tolist()
    assert server.stop() == 0, server.output()


def test_the_deployment_runs_the_image_entrypoint_on_the_configmaps_models(
    start: Any, tmp_path: Path, model_store: Path
) -> None:
    """The Deployment's container: `workbench-entrypoint` with its arguments, the ConfigMap and the volume mounted.

    MODEL_NAME and MODEL_BASE_PATH are set to a model that does not exist: the model config file names the models,
    so the entrypoint must leave them out (workbench would refuse two model sources).
    """
    pod = only("Deployment").document["spec"]["template"]["spec"]
    container = the_container(pod)
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Each volume mount becomes a folder of this test's; mount paths in the arguments follow it.
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in container["volumeMounts"]}
    configmap = only("ConfigMap").document
    for mount in container["volumeMounts"]:
        folder = mounts[mount["mountPath"]]
        folder.mkdir()
        source = volumes[mount["name"]]
        if "configMap" in source:
            assert source["configMap"]["name"] == configmap["metadata"]["name"]
            for key, text in configmap["data"].items():
                (folder / key).write_text(text)
        else:
            claim = source["persistentVolumeClaim"]["claimName"]
            assert claim == only("PersistentVolumeClaim").document["metadata"]["name"]

    def local(path: str) -> str:
        for mount_path, folder in mounts.items():
            if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
                return str(folder) + path[len(mount_path.rstrip("/")) :]
        return path

    # The models the ConfigMap names, each at its base path on the volume: any SavedModel stands in for them,
    # half_plus_two is the one queried.
    config_file = Path(local(flag_value(container["args"], "model_config_file")))
    config = text_format.Parse(config_file.read_text(), model_server_config_pb2.ModelServerConfig())
    names = [model.name for model in config.model_config_list.config]
    assert "half_plus_two" in names
    for model in config.model_config_list.config:
        shutil.copytree(model_store / "hp2_tf2", Path(local(model.base_path)) / "1")
        model.base_path = local(model.base_path)
    config_file.write_text(text_format.MessageToString(config))

    rest_port, grpc_port = free_port(), free_port()
    args = [re.sub(r"=(/.*)$", lambda m: "=" + local(m.group(1)), word) for word in container["args"]]
    # What a user overriding the image's ports does: later flags win over the entrypoint's.
    args += [f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--host=127.0.0.1"]
    server = start(["workbench-entrypoint", *args], env={"MODEL_NAME": "not_served", "MODEL_BASE_PATH": "/nowhere"})

    ports = {p["name"]: rest_port for p in container["ports"] if p["containerPort"] == 8501}
    server.wait_for(http_probe(container, "startupProbe", ports))
    server.wait_for(http_probe(container, "readinessProbe", ports))
    assert server.status(http_probe(container, "livenessProbe", ports)) == 200
    predict_half_plus_two(rest_port, "half_plus_two")
    for name in names:
        assert server.status(f"http://127.0.0.1:{rest_port}/v1/models/{name}") == 200
    assert server.status(f"http://127.0.0.1:{rest_port}/v1/models/not_served") == 404
    assert server.stop() == 0, server.output()


def test_the_entrypoint_serves_model_name_under_model_base_path(start: Any, tmp_path: Path, model_store: Path) -> None:
    """The tensorflow/serving image's command line: env for the model, flags appended (here: the ports)."""
    models = tmp_path / "models"
    shutil.copytree(model_store / "hp2_tf2", models / "half_plus_two" / "1")
    rest_port, grpc_port = free_port(), free_port()
    server = start(
        ["workbench-entrypoint", f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--host=127.0.0.1"],
        env={"MODEL_NAME": "half_plus_two", "MODEL_BASE_PATH": str(models)},
    )
    server.wait_for(
        f"http://127.0.0.1:{rest_port}/v1/models/half_plus_two",
        lambda r: r.status_code == 200 and r.json()["model_version_status"][0]["state"] == "AVAILABLE",
    )
    predict_half_plus_two(rest_port, "half_plus_two")
    assert server.stop() == 0, server.output()
