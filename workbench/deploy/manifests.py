"""Kubernetes and KServe manifests for a model of a workbench server: ``%serve manifests`` and ``workbench manifests``.

:func:`render_manifests` returns file name → YAML text, the same kinds and conventions as the checked-in examples in
``deploy/`` (tests/wire/test_manifests.py renders those examples and compares them, as data, with the files there; the
files keep their longer hand-written comments). The manifests are built as Python data and written with PyYAML.

Two targets:

``kubernetes``
    A Deployment running the image's entry point on a model config file (a ConfigMap listing the model with its
    storage as ``base_path``), a Service (8500 gRPC, 8501 REST), a HorizontalPodAutoscaler, a kustomization, and a
    PersistentVolumeClaim when the storage is ``pvc://CLAIM/PATH`` (or an S3 credentials Secret for ``s3://``).

``kserve``
    An InferenceService on the ``workbench`` ClusterServingRuntime (rendered too: it is cluster-wide and the same
    for every model, apply it once), with the storage as ``storageUri``. For the model formats KServe serves with
    MLServer (``sklearn``, ``xgboost``, ``lightgbm``, ``mlflow``: ``model_format``), the runtime is
    ``workbench-mlserver`` instead: a drop-in for KServe's ``kserve-mlserver``, taking the same environment KServe
    gives MLServer (``serving.kserve.io/server-type: mlserver``) and answering as MLServer does, on the v2 protocol;
    its storageUri is one model's folder (a ``model.joblib``, a booster, an MLflow model's ``MLmodel``), not a
    folder of numbered versions.

Routing (stable, canary and its weight) is *not* written into either. workbench keeps a model's routing in its
repository, ``<base_path>/routing.json``, beside the versions, and every replica reads it when it polls; so the
routing travels with the storage: upload the repository folder with its routing.json. On Kubernetes the replicas
poll the store itself, and a promotion made later through any replica reaches all of them. Under KServe the storage
initializer copies storageUri, routing.json included, into ``/mnt/models`` when a pod starts: every replica of a
revision routes the way the store said at that moment.

Why a workbench canary does not become ``canaryTrafficPercent``: KServe splits traffic between *revisions* of an
InferenceService (the one being rolled out and the last ready one), each a whole copy of storageUri with its own
pods, not between versions inside one storageUri. A canary of version 3 at 10% would have to become two revisions,
one whose storage holds only version 2 and one holding version 3, which is not what the repository holds and would
double the pods. So the manifest carries the model's routing as a comment saying where the replicas read it, and
``canary_traffic_percent`` is a separate, explicit choice: a revision canary for *this* apply (a new image or
storageUri tried on a share of the traffic), which is what KServe means by it.

Why one module of this size: rendering is one job done as data, for two targets that share their constants, probes,
secrets and image handling; split in three they would import each other. The functions read top to bottom: the
API, then Kubernetes' documents, then KServe's, then YAML.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from workbench.config.vocabulary import Argument

__all__ = [
    "DEFAULT_IMAGE",
    "Manifests",
    "ModelSource",
    "Target",
    "kserve_documents",
    "kubernetes_documents",
    "render_manifests",
    "routing_summary",
    "write_manifests",
]

Target = Literal["kserve", "kubernetes"]
TARGETS: tuple[Target, ...] = ("kserve", "kubernetes")
Documents = dict[str, list[dict[str, Any]]]  # file name → the documents it holds

# The image deploy/Dockerfile builds, as the examples in deploy/ name it: replace it with your registry's.
DEFAULT_IMAGE = "registry.example.com/workbench-serving:0.1.0"
# The options `workbench manifests` and `%serve manifests` share, declared once (each takes them in its own order).
MANIFESTS_ARGUMENTS: Mapping[str, Argument] = {
    "replicas": Argument.of("--replicas", type=int, default=2, metavar="N", help="replicas (the autoscaler's minimum)"),
    "image": Argument.of("--image", metavar="IMAGE", help="the workbench image (default: deploy/'s example name)"),
    "model_format": Argument.of(
        "--model_format",
        default="tensorflow",
        metavar="FORMAT",
        help="KServe's modelFormat: tensorflow (the workbench runtime, versions in storageUri) or sklearn, xgboost, "
        "lightgbm, mlflow (the workbench-mlserver runtime, one model's folder; default: tensorflow)",
    ),
}
RUNTIME_NAME = "workbench"
MLSERVER_RUNTIME_NAME = "workbench-mlserver"
# KServe's model formats as kserve-mlserver declares them (name → versions), with the MLServer runtime class KServe
# puts in the modelClass label for each (MLSERVER_MODEL_IMPLEMENTATION). MLflow's priority in kserve-mlserver is 1,
# the others' 2; ours are all 1, so installing workbench-mlserver changes nothing until a service names it.
MLSERVER_FORMATS: Mapping[str, tuple[str, ...]] = {
    "sklearn": ("0", "1"),
    "xgboost": ("1", "2"),
    "lightgbm": ("3", "4"),
    "mlflow": ("1", "2", "3"),  # MLflow 3 writes the same MLmodel folders; kserve-mlserver declares 1 and 2
}
MODEL_FORMATS = ("tensorflow", *MLSERVER_FORMATS)
DEFAULT_CLAIM = "workbench-models"
CONFIG_DIR = "/etc/workbench"  # where the Deployment mounts the ConfigMap
MODELS_DIR = "/models"  # where it mounts the PVC (the image's MODEL_BASE_PATH)
KSERVE_MODELS_DIR = "/mnt/models"  # where KServe's storage initializer puts storageUri
S3_SECRET = "workbench-models-s3"
# The management API's bearer token, from a Secret the operator creates (never written into these manifests):
#   kubectl create secret generic workbench-management --from-literal=token="$(openssl rand -hex 24)"
# A server bound beyond loopback refuses to start without a token (workbench.config.serve_options.management_token).
MANAGEMENT_SECRET = "workbench-management"
MANAGEMENT_TOKEN_ENV = {
    "name": "WORKBENCH_MANAGEMENT_TOKEN",
    "valueFrom": {"secretKeyRef": {"name": MANAGEMENT_SECRET, "key": "token"}},
}
MODELS_READER = "workbench-models-reader"  # the ServiceAccount KServe's storage initializer reads credentials from
DRAIN_SECONDS = 30
DRAIN_DELAY_SECONDS = 5  # not ready, still taking connections, while endpoints update: part of the drain
GRACE_SECONDS = DRAIN_SECONDS + 15
GRPC_PORT, REST_PORT = 8500, 8501  # the image's ports (workbench/deploy/entrypoint.py)
KSERVE_GRPC_PORT, KSERVE_REST_PORT = 9000, 8080  # KServe's conventions for TF Serving
# Pods the autoscaler may add beyond the replicas asked for: room for a burst of four times the base load.
MAX_REPLICAS_FACTOR = 4
_OBJECT_STORE = re.compile(r"^[a-z][a-z0-9+.-]*://")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A model to deploy: its name, where its numbered versions are, and the routing a server reports for it.

    ``storage_uri``: ``s3://…``, ``gs://…`` or another fsspec URL; ``pvc://CLAIM/PATH`` for a PersistentVolumeClaim
    (KServe's own syntax); or a local folder, which only the machine that rendered can read (the manifests say so).
    ``routing``: the model as workbench's management API describes it (``Client.model(name)``), or None.
    """

    name: str
    storage_uri: str
    routing: Mapping[str, Any] | None = None

    @property
    def claim(self) -> tuple[str, str] | None:
        """(claim, path inside it) for a ``pvc://`` storage URI, else None."""
        if not self.storage_uri.startswith("pvc://"):
            return None
        claim, _, path = self.storage_uri[len("pvc://") :].partition("/")
        return claim, path.strip("/")

    @property
    def is_local(self) -> bool:
        return self.storage_uri.startswith("file://") or not _OBJECT_STORE.match(self.storage_uri)

    def base_path(self) -> str:
        """The model's base path inside the Deployment's container."""
        claim = self.claim
        if claim is not None:
            return f"{MODELS_DIR}/{claim[1]}" if claim[1] else MODELS_DIR
        return self.storage_uri


# ------------------------------------------------------------------------------------------------ the API
class Manifests(dict[str, str]):
    """File name → YAML text; shown in a notebook cell as the files, one after the other."""

    def __repr__(self) -> str:
        return "\n".join(f"# ---- {file}\n{text}" for file, text in self.items())

    def _repr_html_(self) -> str:
        return "".join(
            f"<p><code>{html.escape(file)}</code></p><pre>{html.escape(text)}</pre>" for file, text in self.items()
        )

    def write(self, directory: str | Path) -> list[Path]:
        """Write every file into ``directory`` (created if needed); the paths written."""
        return write_manifests(self, directory)


def render_manifests(
    model: str,
    *,
    target: Target,
    storage_uri: str | None = None,
    replicas: int = 2,
    max_replicas: int | None = None,
    image: str = DEFAULT_IMAGE,
    routing: Mapping[str, Any] | None = None,
    canary_traffic_percent: int | None = None,
    name: str | None = None,
    model_format: str = "tensorflow",
) -> Manifests:
    """The manifests that deploy ``model`` with workbench: file name → YAML text (see the module's docstring).

    ``storage_uri`` defaults to ``pvc://workbench-models/MODEL`` (the PVC of deploy/kubernetes). ``replicas`` is the
    Deployment's replicas and the autoscaler's minimum (KServe's ``minReplicas``); the maximum defaults to four
    times that. ``routing`` is ``Client.model(model)``'s answer: it is described in the manifests, and read by the
    replicas from the storage's routing.json. ``canary_traffic_percent`` (KServe only) rolls this apply out as a
    revision canary. ``name`` names the Deployment and its objects (default ``workbench-MODEL``), or the
    InferenceService, which KServe serves the model under (default: MODEL, as a Kubernetes name allows).
    ``model_format`` (KServe only) is the InferenceService's ``modelFormat``; it chooses the runtime.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {replicas}")
    maximum = max_replicas if max_replicas is not None else replicas * MAX_REPLICAS_FACTOR
    if maximum < replicas:
        raise ValueError(f"max_replicas ({maximum}) must be at least replicas ({replicas})")
    if canary_traffic_percent is not None:
        if target != "kserve":
            raise ValueError("canary_traffic_percent is KServe's: a Deployment rolls out with maxSurge instead")
        if not 0 <= canary_traffic_percent <= 100:
            raise ValueError(f"canary_traffic_percent must be from 0 to 100, not {canary_traffic_percent}")
    if model_format not in MODEL_FORMATS:
        raise ValueError(f"model_format must be one of {', '.join(MODEL_FORMATS)}, not {model_format!r}")
    if model_format != "tensorflow" and target != "kserve":
        raise ValueError("model_format is KServe's: a Deployment serves any platform's numbered versions")
    source = ModelSource(model, storage_uri or f"pvc://{DEFAULT_CLAIM}/{model}", routing)
    if target == "kserve":
        name = dns_name(name or model)
        documents = kserve_documents(
            source,
            name=name,
            replicas=replicas,
            max_replicas=maximum,
            image=image,
            canary_traffic_percent=canary_traffic_percent,
            model_format=model_format,
        )
    else:
        name = dns_name(name or f"workbench-{model}")
        documents = kubernetes_documents([source], name=name, replicas=replicas, max_replicas=maximum, image=image)
    headers = _headers(source, target, name, model_format)
    return Manifests({file: _dump(docs, headers.get(file, "")) for file, docs in documents.items()})


def write_manifests(manifests: Mapping[str, str], directory: str | Path) -> list[Path]:
    """Write ``manifests`` (file name → text) into ``directory`` (created if needed); the paths written."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for file, text in manifests.items():
        path = folder / file
        path.write_text(text)
        written.append(path)
    return written


def dns_name(name: str) -> str:
    """``name`` as a Kubernetes object name (RFC 1123 label): lower case, dashes for anything else."""
    label = _NOT_DNS.sub("-", name.lower()).strip("-")[:63].rstrip("-")
    if not label:
        raise ValueError(f"{name!r} has nothing to name a Kubernetes object after")
    return label if label[0].isalpha() else f"m-{label}"[:63]


def routing_summary(model: str, routing: Mapping[str, Any] | None) -> str:
    """One line for what ``Client.model``'s answer says about routing: the stable version and the canary."""
    if not routing:
        return f"{model}: as its routing.json says (not read from a server here)"
    parts = []
    if routing.get("stable") is not None:
        parts.append(f"stable v{routing['stable']}")
    else:
        parts.append(f"default v{routing.get('default_version')} (no version promoted: the newest serves)")
    canary = routing.get("canary")
    if canary:
        parts.append(f"canary v{canary['version']} with {canary['weight']:.0%} of the default traffic")
    return f"{model}: " + ", ".join(parts)


# ------------------------------------------------------------------------------------------- Kubernetes
def kubernetes_documents(
    models: Sequence[ModelSource],
    *,
    name: str = "workbench",
    replicas: int = 2,
    max_replicas: int = 2 * MAX_REPLICAS_FACTOR,
    image: str = DEFAULT_IMAGE,
) -> Documents:
    """A Deployment of ``replicas`` serving ``models`` from one model config file, with its Service, autoscaler,
    ConfigMap, storage (a PVC or S3 credentials) and kustomization: what deploy/kubernetes holds."""
    labels = {"app.kubernetes.io/name": name}
    claims = sorted({source.claim[0] for source in models if source.claim is not None})
    on_s3 = any(source.storage_uri.startswith("s3://") for source in models)
    config_map = f"{name}-models"
    documents: Documents = {
        "configmap.yaml": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": config_map, "labels": labels},
                "data": {"models.config": _model_config(models)},
            }
        ]
    }
    if len(claims) > 1:
        raise ValueError(f"one PersistentVolumeClaim per Deployment, not {', '.join(claims)}")
    if claims:
        documents["pvc.yaml"] = [_claim(claims[0], labels)]
    if on_s3:
        documents["s3-credentials.yaml"] = [_s3_secret(kserve=False)]
    documents["deployment.yaml"] = [_deployment(name, labels, replicas, image, config_map, claims, on_s3)]
    documents["service.yaml"] = [_service(name, labels)]
    documents["hpa.yaml"] = [_autoscaler(name, labels, replicas, max_replicas)]
    documents["kustomization.yaml"] = [_kustomization(list(documents), image)]
    return documents


def _model_config(models: Sequence[ModelSource]) -> str:
    """A text-format ModelServerConfig, as TF Serving's text_format writes it."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    for source in models:
        config.model_config_list.config.add(name=source.name, base_path=source.base_path(), model_platform="tensorflow")
    return text_format.MessageToString(config)


def _claim(claim: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "labels": labels},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }


def _s3_secret(*, kserve: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": S3_SECRET}
    if kserve:  # where KServe's storage initializer finds the store
        metadata["annotations"] = {
            "serving.kserve.io/s3-endpoint": "s3.amazonaws.com",
            "serving.kserve.io/s3-usehttps": "1",
            "serving.kserve.io/s3-region": "us-east-1",
        }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": {
            "AWS_ACCESS_KEY_ID": "REPLACE_WITH_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY": "REPLACE_WITH_SECRET_ACCESS_KEY",
        },
    }


def _probe(path: str, port: int | str, period: int, failures: int, delay: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": path, "port": port}}
    if delay:
        probe["initialDelaySeconds"] = delay
    return probe | {"periodSeconds": period, "failureThreshold": failures}


_LOCKED_DOWN = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}


def _deployment(
    name: str,
    labels: dict[str, str],
    replicas: int,
    image: str,
    config_map: str,
    claims: list[str],
    on_s3: bool,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "workbench",
        "image": image,
        # The image's entry point adds --port=8500 --rest_api_port=8501 --host=0.0.0.0.
        "args": [
            f"--model_config_file={CONFIG_DIR}/models.config",
            "--model_config_file_poll_wait_seconds=60",
            "--file_system_poll_wait_seconds=5",
            f"--drain_seconds={DRAIN_SECONDS}",
            f"--drain_delay_seconds={DRAIN_DELAY_SECONDS}",
        ],
    }
    container["env"] = [MANAGEMENT_TOKEN_ENV]
    if on_s3:  # the variables boto reads, from the Secret of s3-credentials.yaml
        container["env"] += [
            {"name": key, "valueFrom": {"secretKeyRef": {"name": S3_SECRET, "key": key}}}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ]
    container |= {
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": REST_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": _probe("/readyz", "http", period=5, failures=2),
        "livenessProbe": _probe("/healthz", "http", period=10, failures=6),
        # TensorFlow's import and the first loads: up to 5 minutes before liveness counts.
        "startupProbe": _probe("/healthz", "http", period=5, failures=60),
        "resources": _RESOURCES,
        "securityContext": _LOCKED_DOWN,
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": config_map}}]
    for claim in claims:
        container["volumeMounts"].append({"name": "models", "mountPath": MODELS_DIR})
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": claim}})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            # A new pod serves before an old one goes: no capacity lost during a rollout.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(REST_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "terminationGracePeriodSeconds": GRACE_SECONDS,
                    "securityContext": {
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "runAsNonRoot": True,
                        "fsGroup": 1000,  # routing.json is written beside the models by the server's group
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def _service(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": labels,
            "ports": [
                {
                    "name": "grpc",
                    "port": GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {"name": "http", "port": REST_PORT, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    }


def _autoscaler(name: str, labels: dict[str, str], replicas: int, max_replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
                }
            ],
            # Models take a while to load: do not give replicas back on a short lull.
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def _kustomization(files: list[str], image: str) -> dict[str, Any]:
    # deploy/kubernetes lists its resources in the order a reader meets them: config and storage first.
    order = ["configmap.yaml", "s3-credentials.yaml", "pvc.yaml", "deployment.yaml", "service.yaml", "hpa.yaml"]
    repository, tag = _split_image(image)
    entry = {"name": repository} | ({"newTag": tag} if tag else {})
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "labels": [{"pairs": {"app.kubernetes.io/part-of": "workbench"}}],
        "resources": [file for file in order if file in files],
        "images": [entry],
    }


def _split_image(image: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; a registry's port is no tag."""
    head, _, last = image.rpartition("/")
    if ":" in last and "@" not in last:
        name, _, tag = last.partition(":")
        return (f"{head}/{name}" if head else name), tag
    return image, ""


# ----------------------------------------------------------------------------------------------- KServe
def kserve_documents(
    model: ModelSource,
    *,
    name: str | None = None,
    replicas: int = 1,
    max_replicas: int = MAX_REPLICAS_FACTOR,
    image: str = DEFAULT_IMAGE,
    canary_traffic_percent: int | None = None,
    model_format: str = "tensorflow",
) -> Documents:
    """The workbench ClusterServingRuntime and an InferenceService of ``model`` on it (what deploy/kserve holds); for
    MLServer's formats, the workbench-mlserver runtime instead (deploy/kserve-mlflow)."""
    runtime = cluster_serving_runtime(image) if model_format == "tensorflow" else mlserver_serving_runtime(image)
    service = _inference_service(
        model, name or dns_name(model.name), replicas, max_replicas, canary_traffic_percent, model_format
    )
    documents: Documents = {"cluster-serving-runtime.yaml": [runtime], "inference-service.yaml": [service]}
    if model.storage_uri.startswith("gs://"):
        documents["gcs-credentials.yaml"] = [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {
                    "name": MODELS_READER,
                    # GKE's Workload Identity: the Google service account allowed to read the bucket.
                    "annotations": {
                        "iam.gke.io/gcp-service-account": "REPLACE_WITH_NAME@PROJECT.iam.gserviceaccount.com"
                    },
                },
            }
        ]
    if model.storage_uri.startswith("s3://"):
        documents["s3-credentials.yaml"] = [
            _s3_secret(kserve=True),
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": MODELS_READER},
                "secrets": [{"name": S3_SECRET}],
            },
        ]
    return documents


def cluster_serving_runtime(image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """KServe's runtime for workbench: TF Serving's argument conventions, REST 8080, gRPC 9000, /mnt/models; TF
    Serving's API and the Open Inference Protocol (v2) on both."""
    container = {
        "name": "kserve-container",  # where KServe puts storageUri's model and its settings
        "image": image,
        "command": ["workbench", "serve"],
        "args": [
            "--model_name={{.Name}}",
            f"--port={KSERVE_GRPC_PORT}",
            f"--rest_api_port={KSERVE_REST_PORT}",
            f"--model_base_path={KSERVE_MODELS_DIR}",
            "--host=0.0.0.0",  # the kubelet and queue-proxy reach it on the pod's IP
            "--rest_api_timeout_in_ms=60000",
        ],
        "env": [MANAGEMENT_TOKEN_ENV],
        "ports": [{"containerPort": KSERVE_REST_PORT, "name": "http1", "protocol": "TCP"}],
        "readinessProbe": _probe("/readyz", KSERVE_REST_PORT, period=5, failures=3),
        "livenessProbe": _probe("/healthz", KSERVE_REST_PORT, period=10, failures=6, delay=30),
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": True} | _LOCKED_DOWN,
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
    }
    # Priority 1, below kserve-tensorflow-serving's 2: installing it changes nothing for existing services.
    formats = [("tensorflow", "1"), ("tensorflow", "2"), ("workbench", "1")]
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ClusterServingRuntime",
        "metadata": {"name": RUNTIME_NAME},
        "spec": {
            "annotations": {
                "prometheus.kserve.io/port": str(KSERVE_REST_PORT),
                "prometheus.kserve.io/path": "/metrics",
            },
            "supportedModelFormats": [
                {"name": name, "version": version, "autoSelect": True, "priority": 1} for name, version in formats
            ],
            # TF Serving's API (v1) and the Open Inference Protocol (v2), each over REST and gRPC, on the same ports.
            "protocolVersions": ["v1", "v2", "grpc-v1", "grpc-v2"],
            "containers": [container],
        },
    }


def mlserver_serving_runtime(image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """KServe's runtime for MLServer's formats, served by workbench: ``kserve-mlserver``'s formats, environment and
    ports (KServe sets MLSERVER_MODEL_NAME and MLSERVER_MODEL_URI for a runtime of server type ``mlserver``, the
    modelClass label for MLSERVER_MODEL_IMPLEMENTATION), run by ``workbench mlserver start``; the v2 protocol."""
    container = {
        "name": "kserve-container",
        "image": image,
        "command": ["workbench", "mlserver", "start", KSERVE_MODELS_DIR],
        "env": [
            {"name": "MLSERVER_MODEL_IMPLEMENTATION", "value": "{{.Labels.modelClass}}"},
            {"name": "MLSERVER_HTTP_PORT", "value": str(KSERVE_REST_PORT)},
            {"name": "MLSERVER_GRPC_PORT", "value": str(KSERVE_GRPC_PORT)},
            {"name": "MLSERVER_HOST", "value": "0.0.0.0"},  # the kubelet and queue-proxy reach it on the pod's IP
            MANAGEMENT_TOKEN_ENV,
        ],
        "ports": [{"containerPort": KSERVE_REST_PORT, "name": "http1", "protocol": "TCP"}],
        "readinessProbe": _probe("/readyz", KSERVE_REST_PORT, period=5, failures=3),
        "livenessProbe": _probe("/healthz", KSERVE_REST_PORT, period=10, failures=6, delay=30),
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": True} | _LOCKED_DOWN,
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
    }
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ClusterServingRuntime",
        # KServe gives a runtime of this server type MLServer's environment (model name and URI) and v2 by default.
        "metadata": {"name": MLSERVER_RUNTIME_NAME, "annotations": {"serving.kserve.io/server-type": "mlserver"}},
        "spec": {
            "annotations": {
                "prometheus.kserve.io/port": str(KSERVE_REST_PORT),
                "prometheus.kserve.io/path": "/metrics",
            },
            "supportedModelFormats": [
                {"name": name, "version": version, "autoSelect": True, "priority": 1}
                for name, versions in MLSERVER_FORMATS.items()
                for version in versions
            ],
            "protocolVersions": ["v2", "grpc-v2"],
            "containers": [container],
        },
    }


def _inference_service(
    model: ModelSource,
    name: str,
    replicas: int,
    max_replicas: int,
    canary_traffic_percent: int | None,
    model_format: str = "tensorflow",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    predictor: dict[str, Any] = {}
    if canary_traffic_percent is not None:
        metadata["annotations"] = {"serving.kserve.io/deploymentMode": "Serverless"}  # revision canaries need Knative
        predictor["canaryTrafficPercent"] = canary_traffic_percent
    predictor |= {"minReplicas": replicas, "maxReplicas": max_replicas}
    if model.storage_uri.startswith(("s3://", "gs://")):
        predictor["serviceAccountName"] = MODELS_READER
    if model_format == "tensorflow":
        predictor["model"] = {
            "runtime": RUNTIME_NAME,
            "modelFormat": {"name": "tensorflow", "version": "2"},
            "protocolVersion": "v1",
            "storageUri": model.storage_uri,
        }
    else:
        predictor["model"] = {
            "runtime": MLSERVER_RUNTIME_NAME,
            "modelFormat": {"name": model_format, "version": MLSERVER_FORMATS[model_format][-1]},
            "protocolVersion": "v2",
            "storageUri": model.storage_uri,
        }
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": predictor},
    }


# ------------------------------------------------------------------------------------------- the text
_TOKEN_NOTE = (
    "The management API's token comes from a Secret (in each namespace serving models); without it the pods do\n"
    f'not start:  kubectl create secret generic {MANAGEMENT_SECRET} --from-literal=token="$(openssl rand -hex 24)"\n'
)


def _headers(source: ModelSource, target: Target, name: str, model_format: str = "tensorflow") -> dict[str, str]:
    """The comments above each file: how to apply it, where the routing comes from, what to replace."""
    local = (
        f"NOTE: {source.storage_uri} is a folder of the machine that rendered this; a cluster cannot read it.\n"
        "Upload the model's folder (its numbered versions and routing.json) and render again with\n"
        "--storage_uri s3://BUCKET/PATH, gs://BUCKET/PATH or pvc://CLAIM/PATH.\n"
        if source.is_local
        else ""
    )
    routing = routing_summary(source.name, source.routing)
    if target == "kubernetes":
        return {
            "configmap.yaml": local
            + "The models to serve, a text-format ModelServerConfig; the server re-reads it every minute.\n"
            f"Routing: {routing}.\n"
            "The replicas read it from routing.json in the model's base path at every poll of the repository, so a\n"
            "promotion or canary made through any replica (or by editing the file) reaches all of them.\n",
            "deployment.yaml": local
            + f"workbench serving {source.name}. SIGTERM drains: /readyz turns 503, accepted requests finish\n"
            f"within --drain_seconds ({DRAIN_SECONDS}), inside terminationGracePeriodSeconds.\n"
            + _TOKEN_NOTE
            + (
                "gs://: gcsfs reads the pod's Google credentials (GKE Workload Identity: set serviceAccountName),\n"
                "or GOOGLE_APPLICATION_CREDENTIALS pointing at a mounted key file.\n"
                if source.storage_uri.startswith("gs://")
                else ""
            ),
            "kustomization.yaml": "Everything here in one command:  kubectl apply -k DIR\n",
            "pvc.yaml": "The model repository, mounted by every replica at /models: copy the model's folder onto it.\n"
            "Remove this file if the claim exists already.\n",
            "s3-credentials.yaml": "S3 credentials for the replicas (boto's variables). Replace the placeholders,\n"
            "or create the Secret from your secret store and remove this file.\n",
        }
    if model_format != "tensorflow":
        return _mlserver_headers(source, name)
    renamed = (
        f"KServe serves the model under the InferenceService's name: requests go to /v1/models/{name}.\n"
        if name != source.name
        else ""
    )
    return {
        "cluster-serving-runtime.yaml": "The workbench runtime for KServe; cluster-wide, the same for every model:\n"
        "apply it once per cluster.\n" + _TOKEN_NOTE,
        "inference-service.yaml": local + renamed + f"Routing: {routing}.\n"
        "KServe copies storageUri, routing.json included, into /mnt/models when a pod starts: every replica routes\n"
        "by it. canaryTrafficPercent is not that canary: KServe splits traffic between revisions of this resource\n"
        "(a changed storageUri or runtime), not between versions inside one storageUri. To change the routing,\n"
        "change routing.json in the store and roll out a new revision.\n",
        "s3-credentials.yaml": "S3 credentials for KServe's storage initializer. Replace the placeholders, or\n"
        "create the Secret from your secret store and keep only the ServiceAccount.\n",
        "gcs-credentials.yaml": "The identity KServe's storage initializer reads GCS with: on GKE, Workload Identity\n"
        "(replace the placeholder); elsewhere, attach a Secret holding gcloud-application-credentials.json.\n",
    }


def _mlserver_headers(source: ModelSource, name: str) -> dict[str, str]:
    """The comments of the workbench-mlserver runtime's files: one model's folder, v2, MLServer's environment."""
    local = (
        f"NOTE: {source.storage_uri} is a folder of the machine that rendered this; a cluster cannot read it.\n"
        "Upload the model's folder and render again with --storage_uri s3://BUCKET/PATH, gs://… or pvc://CLAIM/PATH.\n"
        if source.is_local
        else ""
    )
    return {
        "cluster-serving-runtime.yaml": "workbench as KServe's MLServer runtime (a drop-in for kserve-mlserver):\n"
        "scikit-learn, XGBoost, LightGBM and MLflow models on the v2 protocol, with the environment KServe gives\n"
        "MLServer.\n"
        "Cluster-wide: apply it once per cluster. Like MLServer, it loads pickles and MLflow's Python models.\n"
        + _TOKEN_NOTE,
        "inference-service.yaml": local + f"KServe serves the model under the InferenceService's name: "
        f"/v2/models/{name}/infer.\n"
        "storageUri is one model's folder (an MLflow model's artifacts, with MLmodel; a model.joblib), which KServe\n"
        "copies into /mnt/models. A new model version is a new storageUri: apply it as a new revision\n"
        "(canaryTrafficPercent splits traffic between this revision and the last ready one).\n",
        "s3-credentials.yaml": "S3 credentials for KServe's storage initializer. Replace the placeholders, or\n"
        "create the Secret from your secret store and keep only the ServiceAccount.\n",
        "gcs-credentials.yaml": "The identity KServe's storage initializer reads GCS with: on GKE, Workload Identity\n"
        "(replace the placeholder); elsewhere, attach a Secret holding gcloud-application-credentials.json.\n",
    }


class _Dumper(yaml.SafeDumper):
    """Block style with list items indented under their key, as deploy/'s files are written."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a shared dict (labels, the security context) is written out each time, never as &id001


def _literal_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # A multi-line value (models.config) stays readable: a literal block, not a quoted string with \n.
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _literal_text)


def _dump(documents: list[dict[str, Any]], header: str) -> str:
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
    return comment + body
