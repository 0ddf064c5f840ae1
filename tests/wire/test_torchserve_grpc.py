"""TorchServe's gRPC APIs (InferenceAPIsService, ManagementAPIsService) on workbench's gRPC port, called with stubs
generated from TorchServe's protos as ts_scripts/torchserve_grpc_client.py calls them; and TorchServe's register by
URL (``POST /models?url=http://…``), fetched from an HTTP server of the test.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
from google.protobuf import empty_pb2
from google.rpc import error_details_pb2
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

ECHO_HANDLER = """
def handle(data, context):
    if data is None:  # the initialising call
        return None
    answers = []
    for i, row in enumerate(data):
        if row.get("data") == b"fail":
            raise RuntimeError("the model broke")
        answers.append({
            "version": context.manifest["model"]["modelVersion"],
            "inputs": {k: v.decode() for k, v in sorted(row.items())},
            "tag": context.get_request_header(i, "x-tag"),
            "sequence": context.get_request_header(i, "ts_request_sequence_id"),
        })
    return answers
"""


def write_echo_mar(path: Path, name: str, version: str) -> None:
    write_mar(path, {"modelName": name, "modelVersion": version, "handler": "echo.py"}, {"echo.py": ECHO_HANDLER})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("grpc-store")
    write_echo_mar(root / "echo_v1.mar", "echo", "1.0")
    write_echo_mar(root / "echo_v2.mar", "echo", "2.0")
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(root), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as opened:
        yield opened


def predict(channel: grpc.Channel, model: str, version: str = "", **kwargs: Any) -> dict[str, Any]:
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    request = inference_pb2.PredictionsRequest(model_name=model, model_version=version, input={"data": b"hello"})
    response = stub.Predictions(request, **{"timeout": 60, **kwargs})
    return json.loads(response.prediction)  # type: ignore[no-any-return]


def fails(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        call(*args, timeout=60, **kwargs)
    return failed.value


def test_ping_and_predictions(channel: grpc.Channel) -> None:
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    assert stub.Ping(empty_pb2.Empty(), timeout=30).health == json.dumps({"status": "Healthy"}, indent=2)
    request = inference_pb2.PredictionsRequest(model_name="echo", input={"data": b"hi", "extra": b"more"})
    response = stub.Predictions(request, metadata=(("x-tag", "t1"),), timeout=60)
    assert json.loads(response.prediction) == {
        "version": "2.0",  # the default: the latest
        "inputs": {"data": "hi", "extra": "more"},  # every entry of the input map, under its name
        "tag": "t1",  # the call's metadata are the request's headers
        "sequence": None,
    }
    assert predict(channel, "echo", "1.0")["version"] == "1.0"  # TorchServe's version string
    (streamed,) = list(stub.StreamPredictions(request, timeout=60))
    assert json.loads(streamed.prediction)["inputs"] == {"data": "hi", "extra": "more"}


def test_errors_have_precise_codes(channel: grpc.Channel) -> None:
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    unknown = fails(stub.Predictions, inference_pb2.PredictionsRequest(model_name="nope", input={"data": b"x"}))
    assert (unknown.code(), unknown.details()) == (grpc.StatusCode.NOT_FOUND, "Model not found: nope")
    version = fails(
        stub.Predictions, inference_pb2.PredictionsRequest(model_name="echo", model_version="9.0", input={"data": b""})
    )
    assert version.code() == grpc.StatusCode.NOT_FOUND
    assert version.details() == "Model version: 9.0 does not exist for model: echo"
    unnamed = fails(stub.Predictions, inference_pb2.PredictionsRequest(input={"data": b"x"}))
    assert (unnamed.code(), unnamed.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "Parameter model_name is required.",
    )
    empty = fails(stub.Predictions, inference_pb2.PredictionsRequest(model_name="echo"))
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT
    broken = fails(stub.Predictions, inference_pb2.PredictionsRequest(model_name="echo", input={"data": b"fail"}))
    assert broken.code() == grpc.StatusCode.UNAVAILABLE and "Prediction failed: RuntimeError" in broken.details()
    streamed = fails(
        lambda request, **kw: list(stub.StreamPredictions(request, **kw)),
        inference_pb2.PredictionsRequest(model_name="nope", input={"data": b"x"}),
    )
    assert streamed.code() == grpc.StatusCode.NOT_FOUND
    assert predict(channel, "echo")["version"] == "2.0"  # and the server serves on


def test_stream_predictions2_answers_a_sequence_in_order(channel: grpc.Channel) -> None:
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    answers: list[Any] = []
    first_answered = threading.Event()

    def requests_of_the_sequence() -> Iterator[Any]:
        yield inference_pb2.PredictionsRequest(
            model_name="echo", input={"data": b"one", "ts_request_sequence_start": b"true"}
        )
        assert first_answered.wait(60)
        sequence_id = answers[0].sequence_id
        yield inference_pb2.PredictionsRequest(model_name="echo", sequence_id=sequence_id, input={"data": b"two"})
        yield inference_pb2.PredictionsRequest(model_name="echo", input={"data": b"no sequence"})
        yield inference_pb2.PredictionsRequest(model_name="echo", sequence_id=sequence_id, input={"data": b"fail"})

    for response in stub.StreamPredictions2(requests_of_the_sequence(), timeout=60):
        answers.append(response)
        first_answered.set()
    assert len(answers) == 4
    one, two = (json.loads(a.prediction) for a in answers[:2])
    assert answers[0].sequence_id.startswith("ts-seq-") and one["sequence"] == answers[0].sequence_id
    assert two["inputs"] == {"data": "two"} and two["sequence"] == answers[0].sequence_id
    missing, failed = answers[2], answers[3]  # failures answer in the stream, which goes on
    assert not missing.prediction and missing.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert missing.status.message == "Parameter sequenceId is required."
    assert failed.status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    info = error_details_pb2.ErrorInfo()
    assert failed.status.details[0].Unpack(info) and info.reason


def test_management_service(server: ServerThread, channel: grpc.Channel) -> None:
    stub = management_pb2_grpc.ManagementAPIsServiceStub(channel)
    listed = json.loads(stub.ListModels(management_pb2.ListModelsRequest(), timeout=30).msg)
    assert listed == {"models": [{"modelName": "echo", "modelUrl": "echo_v2.mar"}]}
    every = json.loads(
        stub.DescribeModel(management_pb2.DescribeModelRequest(model_name="echo", model_version="all")).msg
    )
    assert [(d["modelVersion"], d["modelUrl"]) for d in every] == [("1.0", "echo_v1.mar"), ("2.0", "echo_v2.mar")]
    scaled = stub.ScaleWorker(management_pb2.ScaleWorkerRequest(model_name="echo", min_worker=3, synchronous=True))
    assert scaled.msg == "Workers scaled to 3 for model: echo"
    assert requests.get(f"{server.rest_url}/models/echo", timeout=30).json()[0]["minWorkers"] == 3  # one API, two ways
    default = stub.SetDefault(management_pb2.SetDefaultRequest(model_name="echo", model_version="1.0"), timeout=60)
    assert default.msg == 'Default version successfully updated for model "echo" to "1.0"'
    assert predict(channel, "echo")["version"] == "1.0"
    gone = stub.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="echo", model_version="2.0"))
    assert gone.msg == 'Model "echo" unregistered'
    assert fails(predict, channel, "echo", "2.0").code() == grpc.StatusCode.NOT_FOUND
    back = stub.RegisterModel(management_pb2.RegisterModelRequest(url="echo_v2.mar", initial_workers=1), timeout=60)
    assert back.msg == 'Model "echo" Version: 2.0 registered with 1 initial workers'
    assert predict(channel, "echo", "2.0")["version"] == "2.0"
    unknown = fails(stub.DescribeModel, management_pb2.DescribeModelRequest(model_name="nope"))
    assert (unknown.code(), unknown.details()) == (grpc.StatusCode.NOT_FOUND, "Model not found: nope")
    refused = fails(stub.RegisterModel, management_pb2.RegisterModelRequest(url="s3://bucket/echo.mar"))
    assert refused.code() == grpc.StatusCode.NOT_FOUND and refused.details().startswith("Model not found at: s3://")
    bad = fails(stub.ScaleWorker, management_pb2.ScaleWorkerRequest(model_name="echo", min_worker=3, max_worker=2))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def archive_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An HTTP server of archives on 127.0.0.1 (where TorchServe's users keep theirs: S3 over https, a web server)."""
    folder = tmp_path_factory.mktemp("archive-site")
    write_echo_mar(folder / "fetched.mar", "fetched", "1.0")
    write_echo_mar(folder / "echo_copy.mar", "echo", "1.0")  # a version the store serves already
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=site.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()
    site.server_close()


def test_register_an_archive_by_url(server: ServerThread, archive_site: str) -> None:
    base = server.rest_url
    store = Path(server.server.options.model_repository)
    r = requests.post(f"{base}/models", params={"url": f"{archive_site}/fetched.mar", "initial_workers": 1}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == {"status": 'Model "fetched" Version: 1.0 registered with 1 initial workers'}
    answer = requests.post(f"{base}/predictions/fetched", data=b"x", timeout=60)
    assert answer.status_code == 200 and answer.json()["inputs"] == {"body": "x"}
    assert requests.get(f"{base}/models/fetched", timeout=30).json()[0]["modelUrl"] == "fetched.mar"
    again = requests.post(f"{base}/models", params={"url": f"{archive_site}/fetched.mar"}, timeout=60)
    assert again.status_code == 409
    assert again.json() == {
        "code": 409,
        "type": "ConflictStatusException",
        "message": "Model file already exists fetched.mar",
    }
    copy = requests.post(f"{base}/models", params={"url": f"{archive_site}/echo_copy.mar"}, timeout=60)
    assert (copy.status_code, copy.json()["message"]) == (409, "Model version 1.0 for model echo already registered.")
    assert not (store / "echo_copy.mar").exists()
    absent = requests.post(f"{base}/models", params={"url": f"{archive_site}/absent.mar"}, timeout=60)
    assert absent.status_code == 400 and absent.json()["type"] == "DownloadArchiveException"
    assert "Failed to download archive from" in absent.json()["message"]
    other = requests.post(f"{base}/models", params={"url": "file:///etc/passwd.mar"}, timeout=60)
    assert other.status_code == 404 and other.json()["type"] == "ModelNotFoundException"
    relative = requests.post(f"{base}/models", params={"url": f"{archive_site}/../fetched.mar"}, timeout=60)
    assert relative.status_code == 404 and relative.json()["message"].startswith("Relative path is not allowed")


class _Redirects(http.server.SimpleHTTPRequestHandler):
    """Serves its folder; ``/allowed/elsewhere.mar`` redirects to ``/other/fetched.mar``."""

    def do_GET(self) -> None:
        if self.path == "/allowed/elsewhere.mar":
            self.send_response(302)
            self.send_header("Location", "/other/fetched.mar")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()


def test_registrations_name_only_allowed_urls_and_redirects_stay_within_them(tmp_path: Path) -> None:
    site_folder = tmp_path / "site"
    for part in ("allowed", "other"):
        (site_folder / part).mkdir(parents=True)
        write_echo_mar(site_folder / part / "fetched.mar", "fetched", "1.0")
    handler = functools.partial(_Redirects, directory=str(site_folder))
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    root = f"http://127.0.0.1:{site.server_address[1]}"
    store = tmp_path / "store"
    store.mkdir()
    write_echo_mar(store / "echo.mar", "echo", "1.0")
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(store),
        allow_python_models=True,
        torchserve_allowed_urls=r"http://127\.0\.0\.1:\d+/allowed/.*",
    )
    try:
        with ServerThread(options) as running, grpc.insecure_channel(running.grpc_target) as opened:
            models = f"{running.rest_url}/models"
            refused = requests.post(models, params={"url": f"{root}/other/fetched.mar"}, timeout=60)
            assert refused.status_code == 404, refused.text
            assert refused.json() == {
                "code": 404,
                "type": "ModelNotFoundException",
                "message": f"Given URL {root}/other/fetched.mar does not match any allowed URL(s)",
            }
            # An allowed URL that redirects to one that is not: refused at the hop, nothing written to the store.
            hop = requests.post(models, params={"url": f"{root}/allowed/elsewhere.mar"}, timeout=60)
            assert hop.status_code == 404 and hop.json()["message"] == (
                f"Given URL {root}/other/fetched.mar does not match any allowed URL(s)"
            )
            assert sorted(p.name for p in store.glob("*.mar")) == ["echo.mar"]
            stub = management_pb2_grpc.ManagementAPIsServiceStub(opened)
            by_grpc = fails(stub.RegisterModel, management_pb2.RegisterModelRequest(url=f"{root}/other/fetched.mar"))
            assert by_grpc.code() == grpc.StatusCode.NOT_FOUND and "allowed URL" in by_grpc.details()
            taken = requests.post(models, params={"url": f"{root}/allowed/fetched.mar"}, timeout=60)
            assert taken.status_code == 200, taken.text
            assert requests.post(f"{running.rest_url}/predictions/fetched", data=b"x", timeout=60).status_code == 200
    finally:
        site.shutdown()
        site.server_close()


def test_management_needs_the_token(tmp_path: Path) -> None:
    write_echo_mar(tmp_path / "echo.mar", "echo", "1.0")
    options = ServerOptions(
        rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_python_models=True, management_token="s3cret"
    )
    with ServerThread(options) as guarded, grpc.insecure_channel(guarded.grpc_target) as opened:
        stub = management_pb2_grpc.ManagementAPIsServiceStub(opened)
        refused = fails(stub.ListModels, management_pb2.ListModelsRequest())
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
        listed = stub.ListModels(management_pb2.ListModelsRequest(), metadata=(("authorization", "Bearer s3cret"),))
        assert json.loads(listed.msg)["models"][0]["modelName"] == "echo"
        assert requests.get(f"{guarded.rest_url}/models", timeout=30).status_code == 401
        assert predict(opened, "echo")["version"] == "1.0"  # inference needs no management token
