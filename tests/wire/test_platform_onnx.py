"""The ONNX platform: models converted by skl2onnx and built with onnx.helper, served over REST and gRPC exactly as
ONNX Runtime answers them in-process, with their metadata, batching, and the export side (write, convert)."""

from __future__ import annotations

import base64
import logging
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import onnxruntime
import pytest
import requests
import tensorflow as tf
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from sklearn.datasets import load_digits
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from workbench.config.batching_parameters import BATCHING_FILE_NAME
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.platforms import onnx as onnx_platform
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

METRICS_PATH = "/monitoring/prometheus/metrics"
FIXED_WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
FIXED_BIAS = np.array([1.0, -1.0, 0.5], dtype=np.float32)
# One batch of exactly this many rows runs as soon as they are queued; fewer wait 30 s for more.
EXACT_BATCH = 6


# ============================================================================================= models and servers
@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    data = load_digits()
    return (data.data / 16).astype(np.float32), data.target


@pytest.fixture(scope="module")
def classifier(digits):
    x, y = digits
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)).fit(x, y)


def fixed_batch_model() -> onnx.ModelProto:
    """y = x @ W + b with x float [1,4] and y float [1,3]: a model exported with a batch of one."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "fixed_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        initializer=[
            helper.make_tensor("W", TensorProto.FLOAT, FIXED_WEIGHTS.shape, FIXED_WEIGHTS.ravel()),
            helper.make_tensor("b", TensorProto.FLOAT, FIXED_BIAS.shape, FIXED_BIAS),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def echo_model() -> onnx.ModelProto:
    """Strings in, the same strings out, with a dynamic batch dimension."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "echo",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["batch"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def shapeless_model() -> onnx.ModelProto:
    """An input declared without a shape (unknown rank) and a scalar one: ONNX Runtime reports both as []."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["anything", "scale"], ["scaled"])],
        "shapeless",
        [
            helper.make_tensor_value_info("anything", TensorProto.DOUBLE, None),
            helper.make_tensor_value_info("scale", TensorProto.DOUBLE, []),
        ],
        [helper.make_tensor_value_info("scaled", TensorProto.DOUBLE, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_version(root: Path, model: str, obj: Any) -> Path:
    folder = root / model / "1"
    folder.mkdir(parents=True)
    onnx_platform.write(obj, folder)
    return folder


@pytest.fixture(scope="module")
def repository(tmp_path_factory, digits, classifier) -> Path:
    """digits (skl2onnx, no ZipMap), zipmap (skl2onnx's default ZipMap), names (string labels), fixed, echo."""
    x, y = digits
    root = tmp_path_factory.mktemp("onnx-models")
    write_version(root, "digits", onnx_platform.convert_sklearn(classifier, x[:1]))
    shutil.copytree(root / "digits", root / "digits_exact")
    from skl2onnx import to_onnx

    write_version(root, "zipmap", to_onnx(LogisticRegression(max_iter=300).fit(x, y), x[:1]))
    names = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])[y]
    write_version(root, "names", onnx_platform.convert_sklearn(LogisticRegression(max_iter=300).fit(x, names), x[:1]))
    write_version(root, "fixed", fixed_batch_model())
    write_version(root, "echo", echo_model())
    # digits by its file name; the others by the config's model_platform (TF Serving's field).
    platforms = {"digits": ""} | {
        m: 'model_platform: "onnx"' for m in ("digits_exact", "zipmap", "names", "fixed", "echo")
    }
    config = "".join(f'  config {{ name: "{m}" base_path: "{root / m}" {p} }}\n' for m, p in platforms.items())
    (root / "models.config").write_text("model_config_list {\n" + config + "}\n")
    (root / "monitoring.config").write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}\n')
    return root


@pytest.fixture(scope="module")
def server(repository) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_config_file=str(repository / "models.config"))
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def batched(repository) -> Iterator[ServerThread]:
    """Batching on for every model; digits_exact and fixed have parameters of their own: a batch of exactly 6."""
    exact = (
        f"max_batch_size {{ value: {EXACT_BATCH} }} batch_timeout_micros {{ value: 30000000 }} "
        "num_batch_threads { value: 1 } max_enqueued_batches { value: 10 }\n"
    )
    for model in ("digits_exact", "fixed"):
        (repository / model / BATCHING_FILE_NAME).write_text(exact)
    params = repository / "batching.config"
    params.write_text(
        "max_batch_size { value: 64 } batch_timeout_micros { value: 2000 } "
        "max_enqueued_batches { value: 1000 } num_batch_threads { value: 2 }\n"
    )
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_config_file=str(repository / "models.config"),
        monitoring_config_file=str(repository / "monitoring.config"),
        enable_batching=True,
        batching_parameters_file=str(params),
    )
    try:
        with ServerThread(options) as running:
            yield running
    finally:
        for model in ("digits_exact", "fixed"):
            (repository / model / BATCHING_FILE_NAME).unlink()


@pytest.fixture(scope="module")
def in_process(repository) -> Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """ONNX Runtime's own answers, from a session of the test's (not the platform's): the reference."""
    sessions: dict[str, onnxruntime.InferenceSession] = {}

    def run(model: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if model not in sessions:
            path = str(repository / model / "1" / onnx_platform.MODEL_FILE)
            sessions[model] = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        session = sessions[model]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feed), strict=True))

    return run


def predict(server: ServerThread, model: str, body: Any) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{model}:predict", json=body, timeout=60)


def predict_request(model: str, **inputs: np.ndarray) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return request


def fixed_answer(x: np.ndarray) -> np.ndarray:
    return x @ FIXED_WEIGHTS + FIXED_BIAS


# ================================================================================================ signatures
def test_the_signature_is_the_graph_with_its_types_and_dynamic_dimensions(repository):
    servable = onnx_platform.load("digits", 1, str(repository / "digits" / "1"), LoadPolicy())
    signature = servable.signatures["serving_default"]
    assert list(servable.signatures) == ["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"
    assert {a: (s.dtype, s.shape) for a, s in signature.inputs.items()} == {"X": (np.float32, (-1, 64))}
    assert {a: (s.dtype, s.shape) for a, s in signature.outputs.items()} == {
        "label": (np.int64, (-1,)),
        "probabilities": (np.float32, (-1, 10)),
    }
    assert signature.batchable
    assert servable.left_out == {}
    assert servable.providers[-1] == "CPUExecutionProvider"


def test_a_fixed_batch_dimension_is_not_batchable(repository):
    servable = onnx_platform.load("fixed", 1, str(repository / "fixed" / "1"), LoadPolicy())
    signature = servable.signatures["serving_default"]
    assert signature.inputs["x"].shape == (1, 4) and signature.outputs["y"].shape == (1, 3)
    assert not signature.batchable


def test_unknown_rank_is_told_from_a_scalar(tmp_path):
    write_version(tmp_path, "m", shapeless_model())
    signature = onnx_platform.load("m", 1, str(tmp_path / "m" / "1"), LoadPolicy()).signatures["serving_default"]
    assert signature.inputs["anything"].shape is None
    assert signature.inputs["scale"].shape == ()
    assert signature.inputs["scale"].dtype == np.float64
    assert not signature.batchable


def test_zipmap_outputs_are_left_out_with_a_warning_naming_the_fix(repository, caplog):
    with caplog.at_level("WARNING", logger="workbench.platforms.onnx"):
        servable = onnx_platform.load("zipmap", 1, str(repository / "zipmap" / "1"), LoadPolicy())
    assert list(servable.signatures["serving_default"].outputs) == ["output_label"]
    assert servable.left_out == {"output_probability": "seq(map(int64,tensor(float)))"}
    assert "output_probability is seq(map(int64,tensor(float))), not a tensor" in caplog.text
    assert '"zipmap": False' in caplog.text


def test_a_model_without_tensor_outputs_is_refused(tmp_path, digits):
    x, y = digits
    from skl2onnx import to_onnx

    model = to_onnx(LogisticRegression(max_iter=300).fit(x, y), x[:1])
    label = next(o for o in model.graph.output if o.name == "output_label")
    model.graph.output.remove(label)
    write_version(tmp_path, "m", model)
    with pytest.raises(ServingError) as info:
        onnx_platform.load("m", 1, str(tmp_path / "m" / "1"), LoadPolicy())
    assert info.value.code is Code.FAILED_PRECONDITION
    assert "no tensor output to serve: output_probability (seq(map(int64,tensor(float))))" in info.value.message


@pytest.mark.parametrize(
    ("content", "code", "fragment"),
    [(b"\x08\x07garbage", Code.DATA_LOSS, "Protobuf parsing failed"), (None, Code.NOT_FOUND, "No model.onnx in")],
)
def test_unloadable_folders_fail_with_precise_codes(tmp_path, content, code, fragment):
    if content is not None:
        (tmp_path / onnx_platform.MODEL_FILE).write_bytes(content)
    with pytest.raises(ServingError) as info:
        onnx_platform.load("m", 1, str(tmp_path), LoadPolicy())
    assert info.value.code is code
    assert fragment in info.value.message


def test_cuda_comes_first_only_when_onnx_runtime_has_it():
    assert onnx_platform.choose_providers(["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert onnx_platform.choose_providers(["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert onnx_platform.choose_providers(onnxruntime.get_available_providers())[-1] == "CPUExecutionProvider"


# ==================================================================================================== serving
def test_rest_row_format_answers_as_onnx_runtime_does(server, digits, in_process):
    x = digits[0][:5]
    r = predict(server, "digits", {"instances": x.tolist()})
    assert r.status_code == 200, r.text
    expected = in_process("digits", {"X": x})
    predictions = r.json()["predictions"]
    assert [p["label"] for p in predictions] == expected["label"].tolist()
    np.testing.assert_array_equal(
        np.array([p["probabilities"] for p in predictions], np.float32), expected["probabilities"]
    )


def test_rest_columnar_format_answers_as_onnx_runtime_does(server, digits, in_process):
    x = digits[0][10:13]
    expected = in_process("digits", {"X": x})
    r = predict(server, "digits", {"inputs": {"X": x.tolist()}})
    assert r.status_code == 200, r.text
    outputs = r.json()["outputs"]
    assert outputs["label"] == expected["label"].tolist()
    np.testing.assert_array_equal(np.array(outputs["probabilities"], np.float32), expected["probabilities"])
    r = predict(server, "digits", {"inputs": x.tolist()})  # the one input, unnamed
    assert r.json()["outputs"]["label"] == expected["label"].tolist()


def test_grpc_predict_answers_as_onnx_runtime_does(server, digits, in_process):
    x = digits[0][20:24]
    expected = in_process("digits", {"X": x})
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            predict_request("digits", X=x), timeout=60
        )
    assert response.model_spec.name == "digits" and response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["label"]), expected["label"])
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["probabilities"]), expected["probabilities"])


def test_string_labels_come_back_as_strings(server, digits, in_process):
    x = digits[0][:4]
    expected = in_process("names", {"X": x})["label"].tolist()
    assert expected == ["zero", "one", "two", "three"]
    r = predict(server, "names", {"inputs": x.tolist()})
    assert r.json()["outputs"]["label"] == expected
    request = predict_request("names", X=x)
    request.output_filter.append("label")
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    assert list(response.outputs) == ["label"]
    assert list(response.outputs["label"].string_val) == [e.encode() for e in expected]


def test_string_inputs_round_trip_and_non_utf8_bytes_are_refused(server):
    r = predict(server, "echo", {"instances": ["héllo", {"b64": base64.b64encode(b"plain").decode()}]})
    assert r.json() == {"predictions": ["héllo", "plain"]}
    r = predict(server, "echo", {"instances": [{"b64": base64.b64encode(b"\xff\xfe").decode()}]})
    assert r.status_code == 400
    assert r.json()["error"].startswith('Input "text" expects string [-1] but received bytes that are not UTF-8')


def test_the_fixed_batch_model_answers_one_row_and_refuses_two_naming_the_input(server):
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    r = predict(server, "fixed", {"instances": x.tolist()})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["predictions"], np.float32), fixed_answer(x), rtol=1e-6)
    r = predict(server, "fixed", {"instances": [[1.0, 2.0, 3.0, 4.0]] * 2})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error.startswith('Input "x" expects float [1,4] but received float [2,4]')
    assert "Got invalid dimensions for input: x" in error


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"instances": [[0.5] * 63]}, 'Input "X" expects float [-1,64] but received float [1,63]'),
        ({"inputs": {"X": [["a"] * 64]}}, 'Input "X" expects float [-1,64] but received a JSON String'),
    ],
)
def test_bad_rest_inputs_are_400_naming_the_input(server, body, fragment):
    r = predict(server, "digits", body)
    assert r.status_code == 400
    assert r.json()["error"].startswith(fragment)


@pytest.mark.parametrize(
    ("x", "fragment"),
    [
        (np.zeros((2, 63), np.float32), 'Input "X" expects float [-1,64] but received float [2,63]'),
        (np.zeros((2, 64), np.float64), 'Input "X" expects float [-1,64] but received double [2,64]'),
    ],
)
def test_bad_grpc_inputs_are_invalid_argument_naming_the_input(server, x, fragment):
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(predict_request("digits", X=x), timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(fragment)


def test_rest_metadata_describes_the_graph(server):
    r = requests.get(f"{server.rest_url}/v1/models/digits/metadata", timeout=30)
    assert r.status_code == 200, r.text
    signature = r.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    assert signature["inputs"] == {
        "X": {
            "dtype": "DT_FLOAT",
            "tensor_shape": {"dim": [{"size": "-1", "name": ""}, {"size": "64", "name": ""}], "unknown_rank": False},
            "name": "X",
        }
    }
    assert signature["outputs"]["label"]["dtype"] == "DT_INT64"
    assert signature["outputs"]["probabilities"]["tensor_shape"]["dim"][1]["size"] == "10"
    zipmap = requests.get(f"{server.rest_url}/v1/models/zipmap/metadata", timeout=30).json()
    assert list(zipmap["metadata"]["signature_def"]["signature_def"]["serving_default"]["outputs"]) == ["output_label"]


def test_grpc_metadata_describes_the_graph(server):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "fixed"
    request.metadata_field.append("signature_def")
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=30)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    assert signature.inputs["x"].name == "x"
    assert signature.inputs["x"].dtype == tf.float32.as_datatype_enum
    assert [d.size for d in signature.inputs["x"].tensor_shape.dim] == [1, 4]
    assert [d.size for d in signature.outputs["y"].tensor_shape.dim] == [1, 3]


# =================================================================================================== batching
def _scrape(server: ServerThread) -> str:
    r = requests.get(server.rest_url + METRICS_PATH, timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def _sample(text: str, name: str, **labels: str) -> float | None:
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def test_concurrent_clients_with_batching_get_their_own_answers(batched, digits, in_process):
    x = digits[0]

    def call(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = x[(i * 7) % 1700 :][: 1 + i % 3]
        if i % 3 == 0:
            r = predict(batched, "digits", {"instances": rows.tolist()})
            assert r.status_code == 200, r.text
            answer = r.json()["predictions"]
            labels, probabilities = [a["label"] for a in answer], [a["probabilities"] for a in answer]
        elif i % 3 == 1:
            r = predict(batched, "digits", {"inputs": {"X": rows.tolist()}})
            assert r.status_code == 200, r.text
            labels, probabilities = r.json()["outputs"]["label"], r.json()["outputs"]["probabilities"]
        else:
            with grpc.insecure_channel(batched.grpc_target) as channel:
                response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                    predict_request("digits", X=rows), timeout=60
                )
            labels = tf.make_ndarray(response.outputs["label"])
            probabilities = tf.make_ndarray(response.outputs["probabilities"])
        return rows, np.array(labels), np.array(probabilities, np.float32)

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(call, range(192)))
    for rows, labels, probabilities in answers:
        expected = in_process("digits", {"X": rows})
        np.testing.assert_array_equal(labels, expected["label"])
        # A row's probabilities may differ in the last bits when it is computed in a batch of another size.
        np.testing.assert_allclose(probabilities, expected["probabilities"], rtol=1e-5, atol=1e-7)
    text = _scrape(batched)
    batches = _sample(text, "workbench_batch_size_count", model="digits", version="1")
    rows_run = _sample(text, "workbench_batch_size_sum", model="digits", version="1")
    assert rows_run == sum(len(rows) for rows, _, _ in answers)
    assert batches is not None and batches <= 192


def test_the_same_parameters_batch_digits_but_run_the_fixed_batch_model_request_by_request(batched, digits, caplog):
    caplog.set_level(logging.INFO, logger="workbench.batching.scheduler")
    assert requests.get(batched.rest_url + "/workbench/v1/health", timeout=30).json()["batching"]["fixed"] is True

    def call(model: str, i: int) -> requests.Response:
        row = digits[0][i : i + 1] if model == "digits_exact" else np.full((1, 4), float(i), np.float32)
        return predict(batched, model, {"instances": row.tolist()})

    # Six concurrent rows fill digits_exact's batch of six at once (fewer would wait 30 s for more).
    with ThreadPoolExecutor(max_workers=EXACT_BATCH) as pool:
        answers = list(pool.map(lambda i: call("digits_exact", i), range(EXACT_BATCH)))
    assert [r.status_code for r in answers] == [200] * EXACT_BATCH
    # The same parameters leave the fixed-batch model's requests unmerged: each runs at once, as a batch of one.
    with ThreadPoolExecutor(max_workers=EXACT_BATCH) as pool:
        answers = list(pool.map(lambda i: call("fixed", i), range(EXACT_BATCH)))
    for i, r in enumerate(answers):
        assert r.status_code == 200, r.text
        expected = fixed_answer(np.full((1, 4), float(i), np.float32))
        np.testing.assert_allclose(np.array(r.json()["predictions"], np.float32), expected, rtol=1e-6)

    text = _scrape(batched)
    assert _sample(text, "workbench_batch_size_count", model="digits_exact", version="1") == 1
    assert _sample(text, "workbench_batch_size_sum", model="digits_exact", version="1") == EXACT_BATCH
    assert _sample(text, "workbench_batch_size_count", model="fixed", version="1") == EXACT_BATCH
    assert _sample(text, "workbench_batch_size_bucket", model="fixed", version="1", le="1.0") == EXACT_BATCH
    # The server says so, once, where a user who turned batching on will look.
    said = [r.getMessage() for r in caplog.records if "cannot be batched" in r.getMessage()]
    assert said == ["fixed version 1: signature serving_default cannot be batched (dimension 0 is fixed, or its "
                    "inputs are parsed per request); its requests run one by one"]  # fmt: skip


# ================================================================================================ export side
def test_exports_claims_onnx_models_bytes_and_files_only(tmp_path, classifier, digits):
    model = onnx_platform.convert_sklearn(classifier, digits[0][:1])
    path = tmp_path / "digits.onnx"
    path.write_bytes(model.SerializeToString())
    (tmp_path / "other.bin").write_bytes(model.SerializeToString())
    assert onnx_platform.exports(model)
    assert onnx_platform.exports(model.SerializeToString())
    assert onnx_platform.exports(path) and onnx_platform.exports(str(path))
    assert not onnx_platform.exports(b"not onnx")
    assert not onnx_platform.exports(tmp_path / "other.bin")
    assert not onnx_platform.exports(tmp_path / "missing.onnx")
    assert not onnx_platform.exports(classifier)


@pytest.mark.parametrize("form", ["proto", "bytes", "path"])
def test_write_puts_a_loadable_model_onnx_in_the_folder(tmp_path, classifier, digits, form):
    model = onnx_platform.convert_sklearn(classifier, digits[0][:1])
    source = tmp_path / "source.onnx"
    source.write_bytes(model.SerializeToString())
    obj = {"proto": model, "bytes": model.SerializeToString(), "path": source}[form]
    folder = tmp_path / "version"
    folder.mkdir()
    onnx_platform.write(obj, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["model.onnx"]
    servable = onnx_platform.load("m", 1, str(folder), LoadPolicy())
    signature = servable.signatures["serving_default"]
    x = digits[0][:3]
    np.testing.assert_array_equal(servable.run(signature, {"X": x}, ["label"])["label"], classifier.predict(x))


def test_write_refuses_what_is_not_an_onnx_model(tmp_path):
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        onnx_platform.write(b"\x08garbage that is not protobuf \xff\xff\xff", tmp_path)
    with pytest.raises(TypeError, match="give an onnx.ModelProto"):
        onnx_platform.write({"not": "a model"}, tmp_path)
    with pytest.raises(TypeError, match="take no export options"):
        onnx_platform.write(fixed_batch_model(), tmp_path, opset=12)
    assert list(tmp_path.iterdir()) == []


def test_convert_sklearn_regressors_and_refuses_what_skl2onnx_cannot_convert(tmp_path, digits):
    x, y = digits
    regressor = LinearRegression().fit(x, y.astype(np.float32))
    folder = write_version(tmp_path, "r", onnx_platform.convert_sklearn(regressor, x[:1]))
    servable = onnx_platform.load("r", 1, str(folder), LoadPolicy())
    (alias,) = servable.signatures["serving_default"].outputs
    got = servable.run(servable.signatures["serving_default"], {"X": x[:5]}, [alias])[alias]
    np.testing.assert_allclose(got.ravel(), regressor.predict(x[:5]), rtol=1e-4, atol=1e-4)

    from sklearn.base import BaseEstimator

    class Homemade(BaseEstimator):
        def fit(self, x: np.ndarray, y: np.ndarray) -> Homemade:
            return self

        def predict(self, x: np.ndarray) -> np.ndarray:
            return x[:, 0]

    with pytest.raises(TypeError, match="skl2onnx cannot convert Homemade to ONNX"):
        onnx_platform.convert_sklearn(Homemade().fit(x, y), x[:1])
