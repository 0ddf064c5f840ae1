"""TF Lite models (``model.tflite``) served by LiteRT with TF Serving's REST and gRPC answers, as
tensorflow_model_server serves them with ``--prefer_tflite_model``: the SignatureDefs TF Serving's converter stores,
the model's own signatures, or its tensors by name; batching and warmup; the SavedModel beside it unless preferred.
The models are converted here with TensorFlow's converter (half plus two, half plus three)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import models  # tests/models.py
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from workbench.server import ServerThread


def converted(offset: float) -> bytes:
    """x * 0.5 + offset over [batch, 1], with LiteRT's own signature serving_default (x → y)."""

    class HalfPlus(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x * 0.5 + offset}

    module = HalfPlus()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    return bytes(converter.convert())


def rewritten(data: bytes, signature_def: Any | None) -> bytes:
    """The model without LiteRT's signatures, and with ``signature_def`` stored as TF Serving's converter stores
    SignatureDefs (the ``signature_defs_metadata`` flexbuffer map) when given."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema
    from flatbuffers import flexbuffers

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    model.signatureDefs = []
    if signature_def is not None:
        metadata = flexbuffers.Builder()
        with metadata.Map():
            metadata.Blob("serving_default", signature_def.SerializeToString())
        buffer = schema.BufferT()
        buffer.data = list(metadata.Finish())
        model.buffers.append(buffer)
        entry = schema.MetadataT()
        entry.name, entry.buffer = "signature_defs_metadata", len(model.buffers) - 1
        model.metadata = [*(model.metadata or []), entry]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def tensor_names(data: bytes) -> tuple[str, str]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data)
    return interpreter.get_input_details()[0]["name"], interpreter.get_output_details()[0]["name"]


@pytest.fixture(scope="module")
def tflite_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tensorflow.core.protobuf import meta_graph_pb2

    root = tmp_path_factory.mktemp("tflite")
    two = converted(2.0)
    given, answered = tensor_names(two)
    signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    signature.inputs["x"].name = f"{given}:0"  # TensorFlow's tensor names: TF Lite's tensor, output 0
    signature.outputs["y"].name = f"{answered}:0"
    for name, data in [
        ("native", two),
        ("stored", rewritten(two, signature)),
        ("bare", rewritten(two, None)),
        ("three", converted(3.0)),
    ]:
        (root / name).mkdir()
        (root / name / "model.tflite").write_bytes(data)
    return root


def version(store: Path, tmp_path: Path, name: str, model: str) -> Path:
    base = tmp_path / name
    (base / "1").mkdir(parents=True)
    shutil.copy(store / model / "model.tflite", base / "1" / "model.tflite")
    return base


def rest_predict(server: ServerThread, name: str, body: dict[str, Any]) -> Any:
    answer = requests.post(f"{server.rest_url}/v1/models/{name}:predict", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def grpc_predict(server: ServerThread, name: str, inputs: dict[str, np.ndarray]) -> Any:
    with grpc.insecure_channel(server.grpc_target) as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        for alias, value in inputs.items():
            request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)


@pytest.mark.parametrize("model", ["native", "stored"])
def test_signatures_answer_over_rest_and_grpc(
    model: str, tflite_store: Path, tmp_path: Path, serve: Callable[..., ServerThread]
) -> None:
    """LiteRT's own signature and the SignatureDefs TF Serving keeps in the model's metadata both serve x → y."""
    server = serve(model_base_path=str(version(tflite_store, tmp_path, "m", model)), model_name="m")
    assert rest_predict(server, "m", {"instances": [[2.0], [4.0]]}) == [[3.0], [4.0]]
    answer = grpc_predict(server, "m", {"x": np.array([[2.0]], np.float32)})
    assert tf.make_ndarray(answer.outputs["y"]).tolist() == [[3.0]]
    assert answer.model_spec.version.value == 1
    metadata = requests.get(f"{server.rest_url}/v1/models/m/metadata", timeout=60).json()
    signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert list(signature["inputs"]) == ["x"] and list(signature["outputs"]) == ["y"]


def test_a_model_without_signatures_serves_its_tensors_by_name(
    tflite_store: Path, tmp_path: Path, serve: Callable[..., ServerThread]
) -> None:
    given, answered = tensor_names((tflite_store / "bare" / "model.tflite").read_bytes())
    server = serve(model_base_path=str(version(tflite_store, tmp_path, "m", "bare")), model_name="m")
    answer = requests.post(
        f"{server.rest_url}/v1/models/m:predict", json={"inputs": {given: [[2.0]]}}, timeout=60
    ).json()
    assert answer == {"outputs": [[3.0]]}, answered


def test_inputs_of_another_shape_resize_the_interpreter(
    tflite_store: Path, tmp_path: Path, serve: Callable[..., ServerThread]
) -> None:
    server = serve(model_base_path=str(version(tflite_store, tmp_path, "m", "native")), model_name="m")
    rows = [[float(i)] for i in range(7)]
    assert rest_predict(server, "m", {"instances": rows}) == [[r[0] * 0.5 + 2.0] for r in rows]
    assert rest_predict(server, "m", {"instances": [[2.0]]}) == [[3.0]]  # and back


def test_the_saved_model_serves_unless_tflite_is_preferred(
    tflite_store: Path, make_repo: Callable[..., Path], serve: Callable[..., ServerThread]
) -> None:
    """A folder holding half_plus_two's SavedModel and a half-plus-three model.tflite: TF Serving's choice."""
    base = make_repo("both", {1: "hp2_tf2"})
    shutil.copy(tflite_store / "three" / "model.tflite", base / "1" / "model.tflite")
    saved = serve(model_base_path=str(base), model_name="both")
    assert rest_predict(saved, "both", {"instances": [2.0]}) == [3.0]
    preferred = serve(model_base_path=str(base), model_name="both", prefer_tflite_model=True)
    assert rest_predict(preferred, "both", {"instances": [[2.0]]}) == [[4.0]]


def test_batching_merges_tflite_requests(
    tflite_store: Path, tmp_path: Path, serve: Callable[..., ServerThread]
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server = serve(
        model_base_path=str(version(tflite_store, tmp_path, "m", "native")), model_name="m", enable_batching=True
    )
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: rest_predict(server, "m", {"instances": [[float(i)]]}), range(32)))
    assert answers == [[[i * 0.5 + 2.0]] for i in range(32)]


def test_warmup_requests_run_through_the_interpreter(
    tflite_store: Path, tmp_path: Path, serve: Callable[..., ServerThread]
) -> None:
    good = version(tflite_store, tmp_path, "good", "native")
    models.write_warmup_file(good / "1", [models.predict_log("good", {"x": np.array([[1.0]], np.float32)})])
    bad = version(tflite_store, tmp_path, "bad", "native")
    models.write_warmup_file(bad / "1", [models.predict_log("bad", {"nope": np.array([[1.0]], np.float32)})])
    server = serve(model_base_path=str(good), model_name="good")
    assert rest_predict(server, "good", {"instances": [[2.0]]}) == [[3.0]]
    failing = serve(model_base_path=str(bad), model_name="bad")
    status = requests.get(f"{failing.rest_url}/v1/models/bad", timeout=60).json()
    assert "nope" in status["model_version_status"][0]["status"]["error_message"]


def test_a_file_that_is_not_a_tflite_model_fails_its_load_clearly(
    tmp_path: Path, serve: Callable[..., ServerThread]
) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.tflite").write_bytes(b"not a flatbuffer at all")
    server = serve(model_base_path=str(tmp_path / "m"), model_name="m")
    status = requests.get(f"{server.rest_url}/v1/models/m", timeout=60).json()
    assert "is not a TF Lite model LiteRT can load" in status["model_version_status"][0]["status"]["error_message"]


def test_a_config_that_says_tensorflow_serves_the_tflite_model_when_preferred(
    tflite_store: Path, make_repo: Callable[..., Path], tmp_path: Path, serve: Callable[..., ServerThread]
) -> None:
    """TF Serving's model configs say model_platform "tensorflow"; TF Lite is its TensorFlow: the flag decides."""
    base = make_repo("both", {1: "hp2_tf2"})
    shutil.copy(tflite_store / "three" / "model.tflite", base / "1" / "model.tflite")
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "both" base_path: "{base}" model_platform: "tensorflow" }} }}\n'
    )
    saved = serve(model_config_file=str(config))
    assert rest_predict(saved, "both", {"instances": [2.0]}) == [3.0]
    preferred = serve(model_config_file=str(config), prefer_tflite_model=True)
    assert rest_predict(preferred, "both", {"instances": [[2.0]]}) == [[4.0]]
