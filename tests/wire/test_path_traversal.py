"""Model names, versions and labels from requests never reach the file system: every endpoint that takes one.

One ``workbench serve`` process serves a model repository holding ``hp``. Beside the repository lie a sentinel
model folder (``secret``: a valid SavedModel, with other answers than hp's) and a sentinel file. Path-like names
(``..``, ``a/../b``, ``%2e%2e%2f``, NUL, absolute paths, backslashes, very long ones) go to TF Serving's REST API,
workbench's management API, v2 REST, TF Serving's and v2's gRPC services; each is answered with a clear 4xx or
NOT_FOUND / INVALID_ARGUMENT / FAILED_PRECONDITION, and afterwards the tree around the repository is exactly as it
was (nothing created, changed or deleted) and the sentinel model was never loaded.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (TF Serving's protos without TensorFlow)
from replica import Replica
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc
from waiting import version_states, wait_until

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    """``root/repo/hp/1`` served; ``root/secret/1`` (a model) and ``root/secret.txt`` beside the repository."""
    root = tmp_path_factory.mktemp("traversal")
    shutil.copytree(model_store / "hp2_tf2", root / "repo" / "hp" / "1")
    shutil.copytree(model_store / "hp3_tf2", root / "secret" / "1")
    (root / "secret.txt").write_text("nobody reads this through the server\n")
    return root


@pytest.fixture(scope="module")
def server(layout: Path) -> Iterator[Replica]:
    replica = Replica(layout / "server", f"--model_repository={layout / 'repo'}")
    try:
        replica.wait_ready()
        wait_until(lambda: version_states(replica.rest_url, "hp") == {"1": "AVAILABLE"}, what="hp to serve")
        yield replica
    finally:
        replica.stop()


def names(layout: Path) -> list[str]:
    """Path-like names, aimed at the sentinels beside the repository."""
    secret = str(layout / "secret")
    return [
        "..", ".", "../secret", "../../secret", "..%2fsecret", "%2e%2e", "%2e%2e%2f", "%2e%2e%2fsecret",
        "%252e%252e%252fsecret", "secret", "secret.txt", "../secret.txt", "hp/../../secret", "a/../b", "./hp",
        "hp/", "hp/1", "x%00", "hp\x00", "\x00", secret, secret + "/1", "/etc/passwd", "/", "..\\secret",
        "\\..\\secret", "C:\\secret", "~", "~/secret", "hp\n", "\u2024\u2024/secret", "x" * 4000,
    ]  # fmt: skip


def tree(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under ``root`` but the server's own folder (logs): is it a folder, its size, its mtime."""
    found = {}
    for folder, dirs, files in os.walk(root):
        if Path(folder) == root:
            dirs.remove("server")
        for entry in (*dirs, *files):
            path = Path(folder) / entry
            info = path.lstat()
            found[str(path.relative_to(root))] = (path.is_dir(), info.st_size, info.st_mtime_ns)
    return found


# ------------------------------------------------------------------------------------------------------------ HTTP
def http_request(server: Replica, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    """Send ``path`` as it is (no client normalizes ``..`` or re-encodes it) and return (status, body)."""
    host, port = urllib.parse.urlsplit(server.rest_url).netloc.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def path_forms(name: str) -> list[str]:
    """A name as a URL path segment: percent-encoded (``/`` included), and as written where HTTP allows that."""
    forms = [urllib.parse.quote(name, safe="")]
    if name.isascii() and name.isprintable() and not any(c in name for c in " ?#"):
        forms.append(name)
    return forms


PREDICT = {"instances": [[1.0]]}
EXAMPLES = {"examples": [{"x": 1.0}]}
V2_INFER = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}


def http_endpoints(n: str) -> list[tuple[str, str, object]]:
    """(method, path, body) of every REST endpoint that takes a model name, version or label, with ``n`` in it."""
    return [
        # TF Serving's REST API
        ("GET", f"/v1/models/{n}", None),
        ("GET", f"/v1/models/{n}/metadata", None),
        ("GET", f"/v1/models/hp/versions/{n}", None),
        ("GET", f"/v1/models/hp/labels/{n}", None),
        ("GET", f"/v1/models/hp/labels/{n}/metadata", None),
        ("POST", f"/v1/models/{n}:predict", PREDICT),
        ("POST", f"/v1/models/{n}:classify", EXAMPLES),
        ("POST", f"/v1/models/{n}:regress", EXAMPLES),
        ("POST", f"/v1/models/{n}/versions/1:predict", PREDICT),
        ("POST", f"/v1/models/hp/labels/{n}:predict", PREDICT),
        ("POST", f"/v1/models/hp/versions/{n}:predict", PREDICT),
        # workbench's management API
        ("GET", f"/workbench/v1/models/{n}", None),
        ("POST", f"/workbench/v1/models/{n}:promote", {"version": 1}),
        ("POST", f"/workbench/v1/models/{n}:rollback", {}),
        ("POST", f"/workbench/v1/models/{n}:canary", {"version": 1, "weight": 0.5}),
        ("POST", f"/workbench/v1/models/{n}/versions/1:load", {}),
        ("POST", f"/workbench/v1/models/{n}/versions/1:unload", {}),
        ("POST", f"/workbench/v1/models/hp/versions/{n}:load", {}),
        # the Open Inference Protocol (v2) over REST
        ("GET", f"/v2/models/{n}", None),
        ("GET", f"/v2/models/{n}/ready", None),
        ("GET", f"/v2/models/hp/versions/{n}", None),
        ("POST", f"/v2/models/{n}/infer", V2_INFER),
        ("POST", f"/v2/models/hp/versions/{n}/infer", V2_INFER),
        ("POST", f"/v2/models/{n}/versions/1/infer", V2_INFER),
        ("POST", f"/v2/repository/models/{n}/load", {}),
        ("POST", f"/v2/repository/models/{n}/load", {"parameters": {"version": 1}}),
        ("POST", f"/v2/repository/models/{n}/unload", {"parameters": {"version": 1}}),
        # Triton's shared-memory extension: region names, and keys (what the server opens) from the body
        ("GET", f"/v2/systemsharedmemory/region/{n}/status", None),
        ("POST", f"/v2/systemsharedmemory/region/{n}/register", {"key": n, "byte_size": 8}),
        ("POST", "/v2/systemsharedmemory/region/r/register", {"key": n, "byte_size": 8}),
    ]


# ------------------------------------------------------------------------------------------------------------ gRPC
def grpc_calls(n: str, channel: grpc.Channel) -> list[tuple[str, object, object, set[Code]]]:
    """(what, RPC, request, codes it may be answered with) for every gRPC method that takes a name or label."""
    prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    v2 = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def predict(**spec: str) -> predict_pb2.PredictRequest:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "hp"
        for field, value in spec.items():
            setattr(request.model_spec, field, value)
        request.inputs["x"].dtype = 1
        request.inputs["x"].tensor_shape.dim.add().size = 1
        request.inputs["x"].tensor_shape.dim.add().size = 1
        request.inputs["x"].float_val.append(1.0)
        return request

    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = n
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata.model_spec.name = n
    infer = service_pb2.ModelInferRequest(model_name=n)
    infer.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    infer.raw_input_contents.append(np.ones((1, 1), "<f4").tobytes())
    infer_label = service_pb2.ModelInferRequest()
    infer_label.CopyFrom(infer)
    infer_label.model_name, infer_label.model_version = "hp", n
    version = {"version": service_pb2.ModelRepositoryParameter(int64_param=1)}
    found = {Code.NOT_FOUND}
    return [
        ("Predict name", prediction.Predict, predict(name=n), found),
        ("Predict label", prediction.Predict, predict(version_label=n), {Code.INVALID_ARGUMENT}),
        ("Predict signature", prediction.Predict, predict(signature_name=n), {Code.FAILED_PRECONDITION}),
        ("GetModelMetadata", prediction.GetModelMetadata, metadata, found),
        ("GetModelStatus", models.GetModelStatus, status, found),
        ("ModelInfer name", v2.ModelInfer, infer, found),
        ("ModelInfer version", v2.ModelInfer, infer_label, {Code.NOT_FOUND, Code.INVALID_ARGUMENT}),
        ("ModelMetadata", v2.ModelMetadata, service_pb2.ModelMetadataRequest(name=n), found),
        ("RepositoryModelLoad", v2.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(model_name=n), found),
        (
            "RepositoryModelLoad version",
            v2.RepositoryModelLoad,
            service_pb2.RepositoryModelLoadRequest(model_name=n, parameters=version),
            found,
        ),
        (
            "RepositoryModelUnload",
            v2.RepositoryModelUnload,
            service_pb2.RepositoryModelUnloadRequest(model_name=n, parameters=version),
            found,
        ),
        (
            "SystemSharedMemoryStatus",
            v2.SystemSharedMemoryStatus,
            service_pb2.SystemSharedMemoryStatusRequest(name=n),
            found,
        ),
        (
            "SystemSharedMemoryRegister",
            v2.SystemSharedMemoryRegister,
            service_pb2.SystemSharedMemoryRegisterRequest(name=n, key=n, byte_size=8),
            {Code.INVALID_ARGUMENT},
        ),
        (
            "SystemSharedMemoryRegister key",
            v2.SystemSharedMemoryRegister,
            service_pb2.SystemSharedMemoryRegisterRequest(name="r", key=n, byte_size=8),
            {Code.INVALID_ARGUMENT},
        ),
    ]


def served_models(server: Replica) -> list[str]:
    status, body = http_request(server, "GET", "/workbench/v1/models")
    assert status == 200, body
    return [model["name"] for model in json.loads(body)["models"]]


# ----------------------------------------------------------------------------------------------------------- tests
def test_path_like_names_are_refused_everywhere_and_touch_nothing(server: Replica, layout: Path) -> None:
    assert server.predict("hp") == '{"predictions":[[2.5]]}'  # the server has done what a start does
    before = tree(layout)
    refused: list[str] = []
    for name in names(layout):
        for form in path_forms(name):
            for method, path, body in http_endpoints(form):
                status, answer = http_request(server, method, path, body)
                if not 400 <= status < 500:
                    refused.append(f"{method} {path[:120]!r}: {status} {answer[:200]!r}")
                elif answer:
                    assert "error" in json.loads(answer), (method, path, answer)
    with grpc.insecure_channel(server.grpc_target) as channel:
        for name in names(layout) + ["x" * 10_000]:
            for what, rpc, request, codes in grpc_calls(name, channel):
                try:
                    rpc(request, timeout=60)
                    refused.append(f"{what} {name[:80]!r}: answered")
                except grpc.RpcError as error:
                    if error.code() not in codes:
                        refused.append(f"{what} {name[:80]!r}: {error.code().name} {error.details()[:200]}")
            ready = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelReady(
                service_pb2.ModelReadyRequest(name=name), timeout=60
            )
            assert not ready.ready, name
    assert not refused, "\n".join(refused[:40])
    assert server.proc.poll() is None
    assert tree(layout) == before  # nothing outside (or inside) the repository created, changed or deleted
    assert version_states(server.rest_url, "secret") == {}  # the sentinel model was never loaded
    assert served_models(server) == ["hp"]
    assert server.predict("hp") == '{"predictions":[[2.5]]}'
    assert str(layout / "secret") not in server.log()


def test_a_reload_refuses_model_names_that_are_paths(server: Replica, layout: Path) -> None:
    """gRPC's HandleReloadConfigRequest names models in the request: a name that is a path never becomes a folder
    (a model cache keeps versions under ``<cache>/<name>/<version>``); the models served stay as they were."""
    before = tree(layout)
    with grpc.insecure_channel(server.grpc_target) as channel:
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        for name in ["..", ".", "../secret", "a/b", "..\\secret", "x\x00", "hp\n", str(layout / "secret")]:
            request = model_management_pb2.ReloadConfigRequest()
            config = request.config.model_config_list.config
            config.add(name="hp", base_path=str(layout / "repo" / "hp"), model_platform="tensorflow")
            config.add(name=name, base_path=str(layout / "secret"), model_platform="tensorflow")
            with pytest.raises(grpc.RpcError) as info:
                models.HandleReloadConfigRequest(request, timeout=60)
            assert info.value.code() == Code.INVALID_ARGUMENT, (name, info.value.details())
            assert "cannot name a model" in info.value.details()
    assert tree(layout) == before
    assert version_states(server.rest_url, "hp") == {"1": "AVAILABLE"}
    assert served_models(server) == ["hp"]
