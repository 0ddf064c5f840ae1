"""Handlers (``handler.py`` beside a model): raw bytes in, a label out, around a batched TF or Python model."""

from __future__ import annotations

import concurrent.futures
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import models  # (tests/models.py)
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from workbench.config.options import ServerOptions
from workbench.platforms import Loader
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

MAX_BATCH = 8

# Around save_dense (features float32 [-1,4] → logits [-1,2] = [sum, 2·sum]): text in, a word out.
TEXT_HANDLER = """
import numpy as np

signatures = {
    "serving_default": {"inputs": {"text": ("string", [-1])}, "outputs": {"label": ("string", [-1])}},
}


def preprocess(inputs):
    rows = [[float(v) for v in text.decode().split(",")] for text in inputs["text"]]
    if any(len(row) != 4 for row in rows):
        raise ValueError("each text holds 4 comma-separated numbers")
    return {"features": np.array(rows, np.float32)}


def postprocess(outputs):
    return {"label": np.array([f"big {l[1]:g}" if l[0] > 10 else f"small {l[1]:g}" for l in outputs["logits"]])}
"""

PLUS_ONE_MODEL = """
import workbench


class Double(workbench.PythonModel):
    inputs = {"x": ("float32", [-1])}
    outputs = {"y": ("float32", [-1])}

    def predict(self, inputs):
        return {"y": inputs["x"] * 2}
"""

# No signatures: the model's stay; postprocess only changes the values.
PLUS_ONE_HANDLER = """
def postprocess(outputs):
    return {"y": outputs["y"] + 1}
"""


def label(text: str) -> str:
    total = sum(float(v) for v in text.split(","))
    return f"{'big' if total > 10 else 'small'} {2 * total:g}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("handlers")
    models.save_dense(root / "words" / "1")
    (root / "words" / "1" / "handler.py").write_text(textwrap.dedent(TEXT_HANDLER))
    (root / "plus_one" / "1").mkdir(parents=True)
    (root / "plus_one" / "1" / "model.py").write_text(PLUS_ONE_MODEL)
    (root / "plus_one" / "1" / "handler.py").write_text(PLUS_ONE_HANDLER)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    params = tmp_path_factory.mktemp("batching") / "batching.config"
    params.write_text(
        f"max_batch_size {{ value: {MAX_BATCH} }} batch_timeout_micros {{ value: 5000 }} "
        "max_enqueued_batches { value: 1000 } num_batch_threads { value: 2 }"
    )
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(repo),
        allow_python_models=True,
        enable_batching=True,
        batching_parameters_file=str(params),
    )
    with ServerThread(options) as running:
        yield running


def predict(server: ServerThread, model: str, body: Any) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{model}:predict", json=body, timeout=60)


TEXTS = ["1,2,3,5", "0,0,0,1", "2.5,2.5,2.5,2.5"]


def test_raw_text_in_a_label_out_equal_to_the_in_process_handler(server: ServerThread, repo: Path) -> None:
    local = Loader(LoadPolicy(allow_python=True))("words", 1, str(repo / "words" / "1"))
    try:
        batch = np.array([t.encode() for t in TEXTS], object)
        expected = local.run(local.signatures["serving_default"], {"text": batch}, ["label"])["label"].tolist()
    finally:
        local.close()
    assert expected == [label(t).encode() for t in TEXTS]
    r = predict(server, "words", {"instances": TEXTS})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [e.decode() for e in expected]}
    columnar = predict(server, "words", {"inputs": {"text": TEXTS}})
    assert columnar.json() == {"outputs": [e.decode() for e in expected]}


def test_grpc_predict_through_the_handler(server: ServerThread) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "words"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto([t.encode() for t in TEXTS]))
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    assert [v.decode() for v in response.outputs["label"].string_val] == [label(t) for t in TEXTS]


def test_metadata_shows_the_signature_the_handler_declares(server: ServerThread) -> None:
    r = requests.get(f"{server.rest_url}/v1/models/words/metadata", timeout=30)
    signature = r.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert list(signature["inputs"]) == ["text"] and signature["inputs"]["text"]["dtype"] == "DT_STRING"
    assert list(signature["outputs"]) == ["label"] and signature["outputs"]["label"]["dtype"] == "DT_STRING"


def test_concurrent_clients_each_get_their_own_answer(server: ServerThread) -> None:
    def ask(i: int) -> tuple[list[str], Any]:
        texts = [f"{i},{j},1,1" for j in range(1 + i % 4)]
        return texts, predict(server, "words", {"instances": texts})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(160)))
    for texts, r in results:
        assert r.status_code == 200, r.text
        assert r.json() == {"predictions": [label(t) for t in texts]}
    words = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json()["models"]["words"]["1"]
    print(
        f"\nhandler around a batched TF model, 8 clients: p50 {words['p50_ms']} ms, "
        f"mean batch {words['mean_batch_size']}"
    )


def test_the_model_call_goes_through_the_models_batcher(server: ServerThread) -> None:
    # Only the batcher knows max_batch_size: a request bigger than it is refused there, after preprocess.
    r = predict(server, "words", {"instances": ["1,1,1,1"] * (MAX_BATCH + 1)})
    assert r.status_code == 400
    assert f"larger than maximum input batch size {MAX_BATCH}" in r.json()["error"]


def test_a_request_preprocess_cannot_take_is_a_400_naming_the_handler(server: ServerThread) -> None:
    r = predict(server, "words", {"instances": ["1,2,3"]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert "handler.py of model words version 1: preprocess" in error
    assert "each text holds 4 comma-separated numbers" in error
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "words"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto([b"nope"]))
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as info:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_handler_around_a_python_model_keeps_its_signature(server: ServerThread) -> None:
    r = predict(server, "plus_one", {"instances": [1.0, 2.5]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [3.0, 6.0]}


def test_handlers_are_refused_unless_python_is_allowed(repo: Path) -> None:
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(repo))) as running:
        status = requests.get(f"{running.rest_url}/v1/models/words", timeout=30).json()["model_version_status"][0]
    assert status["state"] == "END"
    assert status["status"]["error_code"] == "FAILED_PRECONDITION"
    assert "handler.py" in status["status"]["error_message"]
    assert "--allow_python_models" in status["status"]["error_message"]
