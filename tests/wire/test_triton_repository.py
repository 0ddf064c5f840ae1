"""Triton model repositories served unchanged: config.pbtxt read, ONNX and Python-backend models answered to the
unchanged tritonclient HTTP and gRPC clients, with reshape, dynamic batching, metadata, config and the index."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from workbench.config import triton_model_config as triton_config
from workbench.config.options import ServerOptions, discover_models
from workbench.config.version_policy import VersionPolicy
from workbench.core.errors import ServingError
from workbench.platforms import triton_backends
from workbench.server import ServerThread

# ================================================================================================ the repository
# The ONNX model takes x as [batch, 2, 2] and gives y = 2x flattened, [batch, 4]; its config says clients send x
# as [batch, 4] (reshape [2, 2]) and get y as [batch, 2, 2] (reshape [4]).
DOUBLER_CONFIG = """
name: "doubler"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { all: {} }
"""

# A Python model as a Triton user writes it: sum and difference, scaled by a config parameter, with an optional
# bias; a negative first element is refused for that request only. "seen" tells how many requests execute got.
ADDSUB_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.scale = float(self.model_config["parameters"]["scale"]["string_value"])
        self.name = args["model_name"]
        out = pb_utils.get_output_config_by_name(self.model_config, "SUM")
        self.sum_dtype = pb_utils.triton_string_to_numpy(out["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            bias = pb_utils.get_input_tensor_by_name(request, "BIAS")
            if (a[:, 0] < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("A must not start negative")))
                continue
            total = (a + b) * self.scale + (bias.as_numpy() if bias is not None else 0)
            seen = np.full((len(a), 1), len(requests), dtype=np.int64)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("SUM", total.astype(self.sum_dtype)),
                        pb_utils.Tensor("DIFF", (a - b).astype(np.float32)),
                        pb_utils.Tensor("SEEN", seen),
                    ]
                )
            )
        return responses

    def finalize(self):
        pass
"""

ADDSUB_CONFIG = """
backend: "python"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "BIAS" data_type: TYPE_FP32 dims: [ 3 ] optional: true }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "DIFF" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "SEEN" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 300000 }
parameters: { key: "scale" value: { string_value: "2" } }
response_cache { enable: true }
"""


def doubler_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["x"], ["flat"], axis=1),
            helper.make_node("Add", ["flat", "flat"], ["y"]),
        ],
        "doubler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write(folder: Path, files: dict[str, str | onnx.ModelProto]) -> None:
    for relative, content in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(textwrap.dedent(content))
        else:
            onnx.save_model(content, str(path))


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("triton-repo")
    model = doubler_model()
    write(root / "doubler", {"config.pbtxt": DOUBLER_CONFIG, "1/model.onnx": model, "2/model.onnx": model})
    # No inputs or outputs declared: completed from the model, as Triton's auto-complete does.
    write(root / "autodoubler", {"config.pbtxt": 'backend: "onnxruntime"\nmax_batch_size: 4\n', "1/model.onnx": model})
    write(root / "addsub", {"config.pbtxt": ADDSUB_CONFIG, "1/model.py": ADDSUB_PY})
    write(
        root / "broken",
        {"config.pbtxt": 'backend: "onnxruntime"\nmax_batch_size: 8\ninput [ { name: "x" \n', "1/model.onnx": model},
    )
    write(root / "tensorrt", {"config.pbtxt": 'platform: "tensorrt_plan"\n', "1/model.plan": "not a plan"})
    return root


@pytest.fixture(scope="module")
def server(repository) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def http(server) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"), concurrency=8)


@pytest.fixture(scope="module")
def grpc_client(server) -> triton_grpc.InferenceServerClient:
    return triton_grpc.InferenceServerClient(server.grpc_target)


def http_input(name: str, value: np.ndarray) -> triton_http.InferInput:
    tensor = triton_http.InferInput(name, list(value.shape), "FP32")
    tensor.set_data_from_numpy(value)
    return tensor


def grpc_input(name: str, value: np.ndarray) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput(name, list(value.shape), "FP32")
    tensor.set_data_from_numpy(value)
    return tensor


def addsub(http, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None):
    inputs = [http_input("A", a), http_input("B", b)] + ([http_input("BIAS", bias)] if bias is not None else [])
    return http.infer("addsub", inputs)


# ============================================================================================== reading configs
def test_the_config_is_read_into_the_description(repository):
    config = triton_backends.read_config(repository / "addsub")
    assert (config.name, config.platform, config.max_batch_size) == ("addsub", "python", 8)
    assert [(t.name, t.dtype, t.dims, t.optional) for t in config.inputs] == [
        ("A", np.dtype(np.float32), (3,), False),
        ("B", np.dtype(np.float32), (3,), False),
        ("BIAS", np.dtype(np.float32), (3,), True),
    ]
    assert config.dynamic_batching == triton_config.DynamicBatching((4, 8), 300000)
    assert (dict(config.parameters), config.response_cache, config.instance_count) == ({"scale": "2"}, True, 1)
    doubler = triton_backends.read_config(repository / "doubler")
    assert (doubler.inputs[0].reshape, doubler.outputs[0].reshape, doubler.instance_count) == ((2, 2), (4,), 2)
    assert doubler.version_policy == VersionPolicy(kind="all")


def test_dynamic_batching_maps_onto_batching_parameters(repository):
    params = triton_config.batching_parameters(str(repository / "addsub"), None)
    assert params is not None
    assert (params.max_batch_size, params.batch_timeout_micros, params.num_batch_threads) == (8, 300000, 1)
    assert params.allowed_batch_sizes == (4, 8)  # the largest preferred size is max_batch_size: mapped
    # Without dynamic_batching a Triton model does not batch, whatever the server's default.
    assert triton_config.batching_parameters(str(repository / "doubler"), params) is None


def test_discovery_takes_the_version_policy_from_the_config(repository):
    policies = {m.name: m.policy for m in discover_models(repository)}
    assert policies["doubler"] == VersionPolicy(kind="all")
    assert policies["addsub"] == VersionPolicy()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('name: "other"\nbackend: "python"\n', 'does not match the model folder "m"'),
        ('backend: "openvino"\n', 'backend "openvino" is not supported by workbench'),
        ("max_batch_size: 1\n", "names no backend"),
        ('backend: "python"\ninput [ { name: "x" data_type: TYPE_BF16 dims: [1] } ]\n', "TYPE_BF16"),
        ('backend: "python"\nmax_batch_size: 2 2\n', "line 2"),
    ],
)
def test_bad_configs_fail_naming_the_file(tmp_path, text, fragment):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(text)
    with pytest.raises(ServingError) as caught:
        triton_backends.read_config(tmp_path / "m")
    assert fragment in caught.value.message and "config.pbtxt" in caught.value.message


# ================================================================================================= ONNX models
def test_onnx_model_answers_with_reshape_over_http_and_grpc(http, grpc_client):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected = (x * 2).reshape(3, 2, 2)
    answer = http.infer("doubler", [http_input("x", x)])
    np.testing.assert_array_equal(answer.as_numpy("y"), expected)
    answer = grpc_client.infer("doubler", [grpc_input("x", x)], model_version="1")
    np.testing.assert_array_equal(answer.as_numpy("y"), expected)


def test_onnx_metadata_and_config_are_the_configs(http, grpc_client):
    metadata = http.get_model_metadata("doubler")
    assert metadata["platform"] == "onnxruntime_onnx" and sorted(metadata["versions"]) == ["1", "2"]
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 2, 2]}]
    config = http.get_model_config("doubler")
    assert (config["name"], config["max_batch_size"], config["backend"]) == ("doubler", 8, "onnxruntime")
    assert config["input"][0]["dims"] == [4] and config["input"][0]["reshape"] == {"shape": [2, 2]}
    assert config["output"][0]["dims"] == [2, 2] and config["instance_group"][0]["count"] == 2
    over_grpc = grpc_client.get_model_config("doubler", as_json=True)["config"]
    assert over_grpc["input"][0]["name"] == "x" and over_grpc["version_policy"] == {"all": {}}


def test_a_config_without_tensors_is_completed_from_the_model(http):
    config = http.get_model_config("autodoubler")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("x", "TYPE_FP32", [2, 2])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("y", [4])]
    x = np.ones((2, 2, 2), dtype=np.float32)
    np.testing.assert_array_equal(http.infer("autodoubler", [http_input("x", x)]).as_numpy("y"), np.full((2, 4), 2))


def test_wrong_shapes_and_oversized_batches_are_refused_naming_the_input(http):
    with pytest.raises(InferenceServerException, match='Input "x" expects float \\[-1,4\\]'):
        http.infer("doubler", [http_input("x", np.ones((2, 3), dtype=np.float32))])
    with pytest.raises(InferenceServerException, match="at most 8"):
        http.infer("doubler", [http_input("x", np.ones((9, 4), dtype=np.float32))])


# =============================================================================================== Python models
def test_python_model_answers_as_numpy_does(http, grpc_client):
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    b = np.array([[0.5, 0.5, 0.5], [1, 1, 1]], dtype=np.float32)
    answer = addsub(http, a, b)
    np.testing.assert_array_equal(answer.as_numpy("SUM"), (a + b) * 2)
    np.testing.assert_array_equal(answer.as_numpy("DIFF"), a - b)
    bias = np.full_like(a, 10)
    answer = grpc_client.infer("addsub", [grpc_input("A", a), grpc_input("B", b), grpc_input("BIAS", bias)])
    np.testing.assert_array_equal(answer.as_numpy("SUM"), (a + b) * 2 + 10)


def test_concurrent_requests_reach_execute_together_and_errors_stay_their_own(http):
    rows = [np.array([[i, i + 1, i + 2]], dtype=np.float32) for i in (-1, 1, 2, 3)]  # the first is refused
    # tritonclient.http's own concurrency (greenlets): all four are on their way before any is answered.
    pending = [http.async_infer("addsub", [http_input("A", a), http_input("B", a)]) for a in rows]
    outcomes: list = []
    for request in pending:
        try:
            outcomes.append(request.get_result())
        except InferenceServerException as exc:
            outcomes.append(exc)
    assert isinstance(outcomes[0], InferenceServerException)
    assert "A must not start negative" in str(outcomes[0]) and outcomes[0].status() == "400"
    seen = []
    for a, answer in zip(rows[1:], outcomes[1:], strict=True):
        np.testing.assert_array_equal(answer.as_numpy("SUM"), a * 4)
        seen.append(int(answer.as_numpy("SEEN")[0, 0]))
    assert max(seen) > 1  # the batcher handed execute several requests at once, each answered on its own


def test_python_model_config_is_the_file_with_triton_defaults(http):
    config = http.get_model_config("addsub")
    assert config["backend"] == "python" and config["parameters"] == {"scale": {"string_value": "2"}}
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["response_cache"] == {"enable": True}


def test_pb_utils_is_importable_only_while_a_triton_python_model_is_loaded(server):
    import sys

    assert "triton_python_backend_utils" in sys.modules  # addsub is loaded


# =============================================================================================== the repository
def test_bad_models_are_unavailable_with_their_reason_and_the_others_serve(http, grpc_client):
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in index["broken"]["reason"] and "line 3" in index["broken"]["reason"]
    assert index["tensorrt"]["state"] == "UNAVAILABLE"
    assert 'platform "tensorrt_plan" is not supported by workbench' in index["tensorrt"]["reason"]
    for model in ("doubler", "autodoubler", "addsub"):
        assert index[model]["state"] == "READY"
    over_grpc = {m.name for m in grpc_client.get_model_repository_index().models if m.state == "READY"}
    assert {"doubler", "autodoubler", "addsub"} <= over_grpc


def test_python_models_are_refused_without_allow_python_models(repository, tmp_path):
    shutil.copytree(repository / "addsub", tmp_path / "addsub")
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path))
    with ServerThread(options) as running:
        client = triton_http.InferenceServerClient(running.rest_url.removeprefix("http://"))
        (row,) = client.get_model_repository_index()
    assert row["state"] == "UNAVAILABLE" and "--allow_python_models" in row["reason"]


def test_model_config_json_has_numbers_not_strings(repository):
    config = triton_backends.read_config(repository / "doubler")
    document = json.loads(json.dumps(triton_config.config_json(config, "doubler")))
    assert document["max_batch_size"] == 8 and document["input"][0]["dims"] == [4]


# =========================================================================================== TensorFlow models
def test_tensorflow_savedmodel_serves_under_its_config(tmp_path):
    import tensorflow as tf

    class Tripler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * 3}

    module = Tripler()
    tf.saved_model.save(module, str(tmp_path / "tripler" / "1" / "model.savedmodel"), signatures=module.serve)
    config = 'platform: "tensorflow_savedmodel"\nmax_batch_size: 4\n'
    config += 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    config += 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    (tmp_path / "tripler" / "config.pbtxt").write_text(config)
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path))) as running:
        client = triton_http.InferenceServerClient(running.rest_url.removeprefix("http://"))
        x = np.array([[1, 2], [3, 4]], dtype=np.float32)
        np.testing.assert_array_equal(client.infer("tripler", [http_input("x", x)]).as_numpy("y"), x * 3)
        assert client.get_model_metadata("tripler")["platform"] == "tensorflow_savedmodel"


def test_max_batch_size_is_completed_for_a_model_that_batches(tmp_path: Path) -> None:
    """Triton's auto-complete: no tensors and no max_batch_size in the file, every tensor of the model with a
    variable first dimension: the default maximum batch size (4); a model of fixed shapes keeps 0."""
    from workbench.platforms import triton
    from workbench.platforms.base import LoadPolicy

    fixed = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "fixed",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    for name, model, expected in [("batching", doubler_model(), 4), ("fixed", fixed, 0)]:
        write(tmp_path / name, {"config.pbtxt": 'platform: "onnxruntime_onnx"\n', "1/model.onnx": model})
        servable = triton.load(name, 1, str(tmp_path / name / "1"), LoadPolicy())
        try:
            assert servable.model_config is not None
            assert servable.model_config["max_batch_size"] == expected
            assert ("dynamic_batching" in servable.model_config) == bool(expected)  # as Triton completes it
            assert servable.signatures["serving_default"].batchable == bool(expected)
            assert (triton.own_batching(servable) is not None) == bool(expected)
        finally:
            servable.close()


AUTO_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)])
            for r in requests
        ]
"""


def test_a_python_model_completes_its_config_with_auto_complete_config(tmp_path: Path) -> None:
    """Triton's Python auto-complete: the model's static auto_complete_config adds its tensors and batch size."""
    from workbench.platforms import triton
    from workbench.platforms.base import LoadPolicy

    write(tmp_path / "auto", {"config.pbtxt": 'backend: "python"\n', "1/model.py": AUTO_PY})
    servable = triton.load("auto", 1, str(tmp_path / "auto" / "1"), LoadPolicy(allow_python=True))
    try:
        config = servable.model_config
        assert config is not None and config["max_batch_size"] == 8 and "dynamic_batching" in config
        assert [(t["name"], t["dims"]) for t in config["input"]] == [("X", [2])]
        signature = servable.signatures["serving_default"]
        assert servable.run(signature, {"X": np.ones((3, 2), np.float32)}, ["Y"])["Y"].tolist() == [[2.0, 2.0]] * 3
    finally:
        servable.close()
    conflicting = AUTO_PY.replace("set_max_batch_size(8)", "set_max_batch_size(16)")
    write(tmp_path / "clash", {"config.pbtxt": 'backend: "python"\nmax_batch_size: 4\n', "1/model.py": conflicting})
    with pytest.raises(ServingError) as refused:
        triton.load("clash", 1, str(tmp_path / "clash" / "1"), LoadPolicy(allow_python=True))
    assert "configuration specified max_batch_size 4" in str(refused.value)
    strict = LoadPolicy(allow_python=True, auto_complete_config=False)
    with pytest.raises(ServingError) as refused:
        triton.load("auto", 1, str(tmp_path / "auto" / "1"), strict)
    assert "auto-complete is off" in str(refused.value)


BATCHED_PY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1]})
        auto_complete_model_config.add_output({"name": "SEEN", "data_type": "TYPE_INT64", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        time.sleep(0.2)  # requests arriving meanwhile wait for the next execute, together
        seen = [len(requests)]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([seen], np.int64))]) for r in requests]
"""


def test_dynamic_batching_set_by_auto_complete_config_batches(tmp_path: Path) -> None:
    write(tmp_path / "batched", {"config.pbtxt": 'backend: "python"\n', "1/model.py": BATCHED_PY})
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_python_models=True)
    with ServerThread(options) as server:
        client = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"), concurrency=8)
        try:
            # 16 requests in flight from the client's own greenlets: its connections belong to this thread's gevent
            # hub, so one client is never shared between threads (gevent cannot switch a socket's waiter across them).
            x = http_input("X", np.ones((1, 1), np.float32))
            pending = [client.async_infer("batched", [x]) for _ in range(16)]
            seen = [int(p.get_result().as_numpy("SEEN")[0, 0]) for p in pending]
        finally:
            client.close()
    assert max(seen) > 1, seen  # several requests reached one execute: the completed config's batching ran
