"""TorchServe's unregister removes a model's only version, and the model with it, as TorchServe does.

TorchServe refuses to unregister the default version of a model that has others, and removes any other version,
the last one included: the model is then gone (``GET /models`` no longer lists it, its predictions and its
description answer 404 "Model not found"), until it is registered again. workbench's own management API keeps a
model's last serving version instead (an unload there tunes which versions serve); TorchServe's unregister asks the
control plane to remove it. Each single-version archive here is unregistered one way: the model or its version, over
REST and over gRPC (TorchServe's own protos), and the server stays ready throughout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests
from model_archives import write_mar

pytest.importorskip("torch")

from workbench.config.options import ServerOptions
from workbench.protocol.torchserve import (
    inference_pb2,
    inference_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
)
from workbench.server import ServerThread

NOOP_HANDLER = """
def handle(data, context):
    if data is None:  # the initialising call
        return None
    return [{"noop": context.manifest["model"]["modelName"]} for _ in data]
"""
MODELS = ("rest_model", "rest_version", "grpc_model", "grpc_version")


def write_noop_mar(path: Path, name: str, version: str) -> None:
    write_mar(path, {"modelName": name, "modelVersion": version, "handler": "noop.py"}, {"noop.py": NOOP_HANDLER})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A model store of single-version archives, one per way of unregistering, beside a two-version one."""
    root = tmp_path_factory.mktemp("unregister-store")
    for name in MODELS:
        write_noop_mar(root / f"{name}.mar", name, "1.0")
    write_noop_mar(root / "two_v1.mar", "two", "1.0")
    write_noop_mar(root / "two_v2.mar", "two", "2.0")
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(root), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as opened:
        yield opened


def listed(server: ServerThread) -> list[str]:
    answer = requests.get(f"{server.rest_url}/models", timeout=30)
    assert answer.status_code == 200, answer.text
    return [m["modelName"] for m in answer.json()["models"]]


def assert_gone_over_rest(server: ServerThread, model: str) -> None:
    """What TorchServe answers for a model it no longer has, and a server that is still ready."""
    assert model not in listed(server)
    not_found = {"code": 404, "type": "ModelNotFoundException", "message": f"Model not found: {model}"}
    for path in (f"/predictions/{model}", f"/predictions/{model}/1.0"):
        answer = requests.post(f"{server.rest_url}{path}", data=b"x", timeout=30)
        assert (answer.status_code, answer.json()) == (404, not_found), path
    described = requests.get(f"{server.rest_url}/models/{model}", timeout=30)
    assert (described.status_code, described.json()) == (404, not_found)
    again = requests.delete(f"{server.rest_url}/models/{model}", timeout=30)
    assert (again.status_code, again.json()) == (404, not_found)
    # A model removed on request is no reason to take the server out of traffic.
    assert requests.get(f"{server.rest_url}/readyz", timeout=30).status_code == 200
    assert requests.get(f"{server.rest_url}/ping", timeout=30).json() == {"status": "Healthy"}


def register_again(server: ServerThread, model: str) -> None:
    back = requests.post(f"{server.rest_url}/models?url={model}.mar&initial_workers=1", timeout=60)
    assert back.json() == {"status": f'Model "{model}" Version: 1.0 registered with 1 initial workers'}
    answer = requests.post(f"{server.rest_url}/predictions/{model}", data=b"x", timeout=60)
    assert (answer.status_code, answer.json()) == (200, {"noop": model})
    assert model in listed(server)


@pytest.mark.parametrize(("model", "path"), [("rest_model", ""), ("rest_version", "/1.0")])
def test_rest_unregister_removes_the_only_version_and_the_model(server: ServerThread, model: str, path: str) -> None:
    assert requests.post(f"{server.rest_url}/predictions/{model}", data=b"x", timeout=60).json() == {"noop": model}
    gone = requests.delete(f"{server.rest_url}/models/{model}{path}", timeout=60)
    assert (gone.status_code, gone.json()) == (200, {"status": f'Model "{model}" unregistered'})
    assert_gone_over_rest(server, model)
    register_again(server, model)


@pytest.mark.parametrize(("model", "version"), [("grpc_model", ""), ("grpc_version", "1.0")])
def test_grpc_unregister_removes_the_only_version_and_the_model(
    server: ServerThread, channel: grpc.Channel, model: str, version: str
) -> None:
    management = management_pb2_grpc.ManagementAPIsServiceStub(channel)
    inference = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    request = inference_pb2.PredictionsRequest(model_name=model, input={"data": b"x"})
    assert json.loads(inference.Predictions(request, timeout=60).prediction) == {"noop": model}

    unregister = management_pb2.UnregisterModelRequest(model_name=model, model_version=version)
    assert management.UnregisterModel(unregister, timeout=60).msg == f'Model "{model}" unregistered'

    listing = json.loads(management.ListModels(management_pb2.ListModelsRequest(), timeout=30).msg)
    assert model not in [m["modelName"] for m in listing["models"]]
    for call, message in (
        (inference.Predictions, request),
        (
            inference.Predictions,
            inference_pb2.PredictionsRequest(model_name=model, model_version="1.0", input=request.input),
        ),
        (management.DescribeModel, management_pb2.DescribeModelRequest(model_name=model)),
        (management.UnregisterModel, unregister),
    ):
        with pytest.raises(grpc.RpcError) as failed:
            call(message, timeout=30)
        assert (failed.value.code(), failed.value.details()) == (grpc.StatusCode.NOT_FOUND, f"Model not found: {model}")
    assert_gone_over_rest(server, model)
    register_again(server, model)


def test_the_default_version_goes_only_once_it_is_the_last(server: ServerThread) -> None:
    refused = requests.delete(f"{server.rest_url}/models/two", timeout=30)
    assert (refused.status_code, refused.json()) == (
        403,
        {"code": 403, "type": "InvalidModelVersionException", "message": "Cannot remove default version for model two"},
    )
    other = requests.delete(f"{server.rest_url}/models/two/1.0", timeout=60)
    assert other.json() == {"status": 'Model "two" unregistered'}
    assert "two" in listed(server)  # version 2.0 serves on
    assert requests.post(f"{server.rest_url}/predictions/two", data=b"x", timeout=60).json() == {"noop": "two"}
    last = requests.delete(f"{server.rest_url}/models/two/2.0", timeout=60)
    assert (last.status_code, last.json()) == (200, {"status": 'Model "two" unregistered'})
    assert_gone_over_rest(server, "two")
