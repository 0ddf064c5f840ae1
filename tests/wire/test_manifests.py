"""workbench.deploy.manifests, ``%serve manifests`` and ``workbench manifests``: what they render validates as the API
servers would check it (Kubernetes' schemas through kubernetes-validate, KServe's CRD schemas), says what it must
(replicas, storage, the model's routing), equals the examples in deploy/ for the examples' inputs, and comes from a
real server's routing through IPython and the command line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from waiting import wait_until

from workbench import cli
from workbench.deploy.manifests import (
    DEFAULT_IMAGE,
    MANAGEMENT_SECRET,
    Manifests,
    ModelSource,
    Target,
    cluster_serving_runtime,
    kserve_documents,
    kubernetes_documents,
    render_manifests,
)
from workbench.models.routing.routing_file import ROUTING_FILE, decode

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KSERVE_SCHEMAS = ROOT.parent / "shared" / "testdata" / "kserve"  # beside the repository in CI, not in a clone
KUBERNETES_VERSION = "1.34.0"  # as tests/system/test_deploy.py: the oldest Kubernetes kubernetes-validate knows
SERVER = "manifests"  # this module's notebook server's name: other modules' servers may share the shell
CANARY = {"version": 2, "weight": 0.25}
ROUTING = {"name": "hp", "base_path": "/srv/hp", "stable": 1, "default_version": 1, "canary": CANARY}


def documents(manifests: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Each file's YAML documents, parsed back as a cluster would read them."""
    return {file: [d for d in yaml.safe_load_all(text) if d is not None] for file, text in manifests.items()}


def one(manifests: dict[str, str], kind: str) -> dict[str, Any]:
    found = [d for docs in documents(manifests).values() for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} in {list(manifests)}"
    return found[0]


def validate(document: dict[str, Any]) -> None:
    """What the API server checks structurally: Kubernetes' own schemas, or KServe's CRD schema for its kinds."""
    if document["apiVersion"].startswith("serving.kserve.io/"):
        if not KSERVE_SCHEMAS.is_dir():
            pytest.skip(f"KServe's CRD schemas are not here ({KSERVE_SCHEMAS}: ../shared is absent outside CI)")
        schema = json.loads((KSERVE_SCHEMAS / f"{document['kind']}.schema.json").read_text())
        validator = jsonschema.Draft4Validator(schema["versions"][document["apiVersion"].split("/")[1]])
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
        assert errors == []
    elif document["kind"] != "Kustomization":  # kustomize's own file: no API server ever sees it
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


# ------------------------------------------------------------------------------------ rendered = validated
STORAGE = ["s3://models/hp", "gs://models/hp", "pvc://workbench-models/hp", "/home/me/workbench-models/hp"]


@pytest.mark.parametrize("storage_uri", STORAGE)
@pytest.mark.parametrize("target", ["kserve", "kubernetes"])
def test_every_rendered_manifest_validates(target: Target, storage_uri: str) -> None:
    manifests = render_manifests("half_plus_two", target=target, storage_uri=storage_uri, routing=ROUTING)
    assert all(text.endswith("\n") for text in manifests.values())
    rendered = [d for docs in documents(manifests).values() for d in docs]
    # The built-in kinds first: a missing ../shared skips only KServe's, after these have been checked.
    for document in sorted(rendered, key=lambda d: d["apiVersion"].startswith("serving.kserve.io/")):
        validate(document)


@pytest.mark.parametrize("target", ["kserve", "kubernetes"])
def test_a_broken_manifest_fails_the_validation(target: Target) -> None:
    """The check above can fail: a number where Kubernetes (or KServe) wants a number, given as a word."""
    rendered = documents(render_manifests("hp", target=target, storage_uri="s3://models/hp"))
    kind = "InferenceService" if target == "kserve" else "Deployment"
    (broken,) = [d for docs in rendered.values() for d in docs if d["kind"] == kind]
    if target == "kserve":
        broken["spec"]["predictor"]["minReplicas"] = "two"
        if not KSERVE_SCHEMAS.is_dir():
            pytest.skip(f"KServe's CRD schemas are not here ({KSERVE_SCHEMAS})")
        with pytest.raises(AssertionError, match="minReplicas"):
            validate(broken)
    else:
        broken["spec"]["replicas"] = "two"
        with pytest.raises(kubernetes_validate.ValidationError, match="two"):
            validate(broken)


def test_the_kustomization_lists_every_file_rendered_beside_it() -> None:
    for storage_uri in STORAGE:
        manifests = render_manifests("hp", target="kubernetes", storage_uri=storage_uri)
        listed = one(manifests, "Kustomization")["resources"]
        assert sorted(listed) == sorted(set(manifests) - {"kustomization.yaml"})


# ------------------------------------------------------------------------------- what the manifests say
def test_kubernetes_replicas_and_an_object_store() -> None:
    manifests = render_manifests("half_plus_two", target="kubernetes", storage_uri="s3://models/hp", replicas=3)
    deployment, hpa = one(manifests, "Deployment"), one(manifests, "HorizontalPodAutoscaler")
    assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"] == 3
    assert hpa["spec"]["maxReplicas"] == 12
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"] == "workbench-half-plus-two"
    config = one(manifests, "ConfigMap")["data"]["models.config"]
    assert 'name: "half_plus_two"' in config and 'base_path: "s3://models/hp"' in config
    # An object store: no volume for the models, credentials from the Secret the files carry.
    assert "pvc.yaml" not in manifests
    pod = deployment["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["config"]
    secret = one(manifests, "Secret")["metadata"]["name"]
    (container,) = pod["containers"]
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert secrets == {
        "AWS_ACCESS_KEY_ID": secret,
        "AWS_SECRET_ACCESS_KEY": secret,
        "WORKBENCH_MANAGEMENT_TOKEN": MANAGEMENT_SECRET,
    }
    assert container["image"] == DEFAULT_IMAGE


def test_every_server_takes_its_management_token_from_a_secret_never_from_the_manifests() -> None:
    """The pods bind every address, so the server needs a token (it refuses to start without one): the manifests
    hand it over from the Secret the operator creates, and no manifest holds a token itself."""
    servers = [one(render_manifests("hp", target="kubernetes", storage_uri="s3://models/hp"), "Deployment")]
    servers.append(cluster_serving_runtime())
    for server in servers:
        spec = server["spec"]
        (container,) = spec["template"]["spec"]["containers"] if "template" in spec else spec["containers"]
        (env,) = [e for e in container["env"] if e["name"] == "WORKBENCH_MANAGEMENT_TOKEN"]
        assert env["valueFrom"]["secretKeyRef"] == {"name": MANAGEMENT_SECRET, "key": "token"}
        assert not any("management_token" in arg for arg in container.get("args", []))


def test_kubernetes_on_a_volume_claim() -> None:
    manifests = render_manifests("hp", target="kubernetes", storage_uri="pvc://shared-models/team/hp", replicas=1)
    claim = one(manifests, "PersistentVolumeClaim")["metadata"]["name"]
    assert claim == "shared-models"
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == claim
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "models"]
    assert 'base_path: "' + mount["mountPath"] + '/team/hp"' in one(manifests, "ConfigMap")["data"]["models.config"]
    assert "Secret" not in {d["kind"] for docs in documents(manifests).values() for d in docs}


def test_kserve_replicas_storage_and_credentials() -> None:
    manifests = render_manifests("digits", target="kserve", storage_uri="s3://models/digits", replicas=3)
    service = one(manifests, "InferenceService")
    predictor = service["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (3, 12)
    assert predictor["model"]["storageUri"] == "s3://models/digits"
    assert predictor["model"]["runtime"] == one(manifests, "ClusterServingRuntime")["metadata"]["name"]
    assert predictor["serviceAccountName"] == one(manifests, "ServiceAccount")["metadata"]["name"]
    assert "canaryTrafficPercent" not in predictor  # only when asked for: see the canary tests
    on_a_claim = one(render_manifests("digits", target="kserve", storage_uri="pvc://m/digits"), "InferenceService")
    assert "serviceAccountName" not in on_a_claim["spec"]["predictor"]
    on_gcs = render_manifests("digits", target="kserve", storage_uri="gs://models/digits")
    account = one(on_gcs, "ServiceAccount")["metadata"]["name"]
    assert one(on_gcs, "InferenceService")["spec"]["predictor"]["serviceAccountName"] == account


def test_a_model_name_kubernetes_cannot_take_is_said_where_it_changes() -> None:
    manifests = render_manifests("half_plus_two", target="kserve", storage_uri="s3://m/half_plus_two")
    assert one(manifests, "InferenceService")["metadata"]["name"] == "half-plus-two"
    assert "requests go to /v1/models/half-plus-two" in manifests["inference-service.yaml"]
    named = render_manifests("half_plus_two", target="kubernetes", name="Serving_HP", storage_uri="s3://m/hp")
    assert {d["metadata"]["name"] for d in documents(named)["deployment.yaml"]} == {"serving-hp"}
    assert one(named, "ConfigMap")["data"]["models.config"].count('name: "half_plus_two"') == 1


def test_a_local_folder_is_rendered_with_what_a_cluster_needs_instead() -> None:
    for target in ("kserve", "kubernetes"):
        manifests = render_manifests("hp", target=target, storage_uri="/home/me/models/hp")  # type: ignore[arg-type]
        assert "/home/me/models/hp is a folder of the machine that rendered this" in repr(manifests)
        assert "s3://" in repr(manifests) and "pvc://" in repr(manifests)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"target": "helm"}, "target must be one of"),
        ({"target": "kubernetes", "replicas": 0}, "replicas must be at least 1"),
        ({"target": "kubernetes", "replicas": 4, "max_replicas": 2}, "must be at least replicas"),
        ({"target": "kserve", "canary_traffic_percent": 101}, "from 0 to 100"),
        ({"target": "kubernetes", "canary_traffic_percent": 10}, "KServe's"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(arguments: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        render_manifests("hp", **arguments)


# -------------------------------------------------------------------------------------------- the canary
def test_a_canary_is_described_where_the_replicas_read_it_not_as_a_revision_split() -> None:
    """KServe's canaryTrafficPercent splits revisions, not versions: the routing travels in routing.json."""
    kserve = render_manifests("hp", target="kserve", storage_uri="s3://models/hp", routing=ROUTING)
    assert "canaryTrafficPercent" not in one(kserve, "InferenceService")["spec"]["predictor"]
    text = kserve["inference-service.yaml"]
    assert "hp: stable v1, canary v2 with 25% of the default traffic" in text
    assert "routing.json" in text
    kubernetes = render_manifests("hp", target="kubernetes", storage_uri="s3://models/hp", routing=ROUTING)
    assert "hp: stable v1, canary v2 with 25% of the default traffic" in kubernetes["configmap.yaml"]
    assert "routing.json" in kubernetes["configmap.yaml"]


def test_a_revision_canary_is_an_explicit_choice() -> None:
    manifests = render_manifests("hp", target="kserve", storage_uri="s3://m/hp", canary_traffic_percent=10)
    service = one(manifests, "InferenceService")
    assert service["spec"]["predictor"]["canaryTrafficPercent"] == 10
    # Revision canaries are Knative's: the resource asks for that mode rather than the cluster's default.
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    validate(service)


# ----------------------------------------------------------------------------------- deploy/ is rendered
def deploy_files(folder: str) -> dict[str, list[dict[str, Any]]]:
    return {
        path.name: [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        for path in sorted((DEPLOY / folder).glob("*.yaml"))
    }


def test_deploy_kserve_is_what_render_manifests_writes_for_its_example() -> None:
    """deploy/kserve's files, their hand-written comments aside, are this module's output for the digits example:
    a change to one without the other fails here."""
    rendered = render_manifests(
        "digits", target="kserve", storage_uri="s3://models/digits", replicas=1, canary_traffic_percent=10
    )
    assert documents(rendered) == deploy_files("kserve")


def test_deploy_kserve_mlflow_is_what_render_manifests_writes_for_its_example() -> None:
    """deploy/kserve-mlflow: the workbench-mlserver runtime and an MLflow model's InferenceService on it."""
    rendered = render_manifests(
        "wine",
        target="kserve",
        storage_uri="s3://mlflow/1/models/m-0123456789abcdef/artifacts",
        replicas=1,
        model_format="mlflow",
    )
    assert documents(rendered) == deploy_files("kserve-mlflow")


def test_model_formats_choose_the_runtime_and_protocol() -> None:
    for model_format in ("sklearn", "xgboost", "lightgbm", "mlflow"):
        manifests = render_manifests("m", target="kserve", storage_uri="s3://b/m", model_format=model_format)
        runtime = one(manifests, "ClusterServingRuntime")
        model = one(manifests, "InferenceService")["spec"]["predictor"]["model"]
        assert (model["runtime"], model["protocolVersion"]) == (runtime["metadata"]["name"], "v2")
        assert model["modelFormat"]["name"] == model_format
        assert "/v2/models/m/infer" in manifests["inference-service.yaml"]
    with pytest.raises(ValueError, match="model_format must be one of"):
        render_manifests("m", target="kserve", model_format="pmml")
    with pytest.raises(ValueError, match="model_format is KServe's"):
        render_manifests("m", target="kubernetes", model_format="mlflow")


def test_deploy_kubernetes_is_what_the_module_builds_for_its_example() -> None:
    example = [ModelSource(name, f"pvc://workbench-models/{name}") for name in ("half_plus_two", "digits")]
    built = kubernetes_documents(example, name="workbench", replicas=2, max_replicas=8)
    assert built == deploy_files("kubernetes")
    single = kserve_documents(ModelSource("digits", "s3://models/digits"), canary_traffic_percent=10)
    assert single == deploy_files("kserve")  # the defaults are the example's: one replica, up to four


# ------------------------------------------------------------------------------ from a server, in a cell
@pytest.fixture(scope="module")
def served(
    ipython_shell: InteractiveShell, tmp_path_factory: pytest.TempPathFactory, model_store: Path
) -> Iterator[SimpleNamespace]:
    """A notebook server on a repository with hp v1 and v2; v1 promoted, v2 a 25% canary."""
    repo = tmp_path_factory.mktemp("manifests-repo")
    for version in (1, 2):
        shutil.copytree(model_store / "hp2_tf2", repo / "hp" / str(version))
    ip = ipython_shell
    handle = ip.run_line_magic("serve", f"start --server_name {SERVER} --model_repository {repo}")
    try:
        handle.wait_for_version("hp", 2)
        ip.run_line_magic("serve", f"promote hp 1 --server_name {SERVER}")
        ip.run_line_magic("serve", f"canary hp 2 0.25 --server_name {SERVER}")
        wait_until(lambda: handle.client.model("hp")["canary"] == CANARY, timeout=60, what="the canary")
        yield SimpleNamespace(ip=ip, handle=handle, repo=repo)
    finally:
        ip.run_line_magic("serve", f"stop {SERVER}")


def test_serve_manifests_shows_the_servers_routing_in_the_cell(served: SimpleNamespace) -> None:
    shown = served.ip.run_line_magic("serve", f"manifests hp --kserve --server_name {SERVER}")
    assert isinstance(shown, Manifests)
    assert "hp: stable v1, canary v2 with 25% of the default traffic" in repr(shown)
    # No --storage_uri: the server's own folder, with what a cluster needs instead.
    model_folder = served.repo / "hp"
    service = one(shown, "InferenceService")
    assert Path(service["spec"]["predictor"]["model"]["storageUri"]).resolve() == model_folder.resolve()
    assert "a cluster cannot read it" in repr(shown)
    html = shown._repr_html_()
    assert html.count("<pre>") == len(shown) and "kind: InferenceService" in html
    # What the replicas will route by: the repository's routing.json, beside the versions.
    routing_file = model_folder / ROUTING_FILE
    stored = decode(routing_file.read_bytes(), str(routing_file)).routing
    assert (stored.stable, stored.canary, stored.canary_weight) == (1, 2, 0.25)


def test_serve_manifests_writes_the_files_with_out(
    served: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k8s"
    line = f"manifests hp --kubernetes --storage-uri s3://bucket/models/hp --replicas 3 --out {out} --server {SERVER}"
    shown = served.ip.run_line_magic("serve", line)
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(shown)
    for file, text in shown.items():
        assert (out / file).read_text() == text
        assert f"wrote {out / file}" in printed
    assert one(shown, "Deployment")["spec"]["replicas"] == 3
    assert 'base_path: "s3://bucket/models/hp"' in one(shown, "ConfigMap")["data"]["models.config"]
    assert "canary v2 with 25%" in shown["configmap.yaml"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("manifests hp", "give one of --kserve or --kubernetes"),
        ("manifests hp --kserve --kubernetes", "give one of --kserve or --kubernetes"),
        ("manifests nope --kserve", "NOT_FOUND"),
        ("manifests hp --kubernetes --replicas 0", "replicas must be at least 1"),
    ],
)
def test_serve_manifests_mistakes_are_one_line_errors(served: SimpleNamespace, line: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem) as caught:
        served.ip.run_line_magic("serve", f"{line} --server_name {SERVER}")
    assert "\n" not in str(caught.value)


def test_the_command_line_reads_routing_from_a_server(
    served: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = served.handle.rest_url
    assert cli.main(["manifests", "hp", "--kserve", "--storage_uri=gs://b/hp", f"--server={url}"]) == 0
    printed = capsys.readouterr().out
    assert "hp: stable v1, canary v2 with 25% of the default traffic" in printed
    assert "storageUri: gs://b/hp" in printed
    out = tmp_path / "out"
    assert cli.main(["manifests", "hp", "--kubernetes", f"--out={out}", "--replicas=4"]) == 0
    assert one(Manifests((p.name, p.read_text()) for p in out.iterdir()), "Deployment")["spec"]["replicas"] == 4
    assert cli.main(["manifests", "hp", "--kubernetes", "--replicas=0"]) == 2
    assert "replicas must be at least 1" in capsys.readouterr().err


def test_the_command_lines_examples_parse() -> None:
    parser = cli.build_parser()
    help_text = parser._subparsers._group_actions[0].choices["manifests"].format_help()  # type: ignore[union-attr]
    examples = [line.split()[1:] for line in help_text.split("examples:\n", 1)[1].splitlines() if line.strip()]
    assert len(examples) == 3
    for words in examples:
        assert parser.parse_args(words).command is cli._manifests
