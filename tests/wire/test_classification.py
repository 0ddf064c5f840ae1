"""Triton's classification extension: an output answered as its top classes ("value:index[:label]"), ranked per
row, labelled from the config's label_filename, over REST, gRPC and gRPC streams with the unchanged tritonclient."""

from __future__ import annotations

import queue
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from onnx import TensorProto, helper

from workbench.config.options import ServerOptions
from workbench.core.classification import top_classes
from workbench.server import ServerThread

SCORES_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
"""


def identity_model(shape: list[Any]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("classification")
    for name, config, shape in [
        ("scores", SCORES_CONFIG, ["batch", 4]),
        ("unbatched", SCORES_CONFIG.replace("max_batch_size: 4", "max_batch_size: 0"), [4]),
    ]:
        (root / name / "1").mkdir(parents=True)
        onnx.save_model(identity_model(shape), str(root / name / "1" / "model.onnx"))
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
        (root / name / "labels.txt").write_text("apple\nbanana\ncherry\ndate\n")
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(root))) as running:
        yield running


ROWS = np.array([[1.1, 3.3, 0.5, 2.4], [9.0, 1.0, 8.0, 7.5]], np.float32)


def ask(client: Any, module: Any, model: str, value: np.ndarray, count: int) -> np.ndarray:
    tensor = module.InferInput("x", list(value.shape), "FP32")
    tensor.set_data_from_numpy(value)
    return client.infer(model, [tensor], outputs=[module.InferRequestedOutput("y", class_count=count)]).as_numpy("y")


def test_the_top_classes_of_each_row_come_labelled_over_rest_and_grpc(server: ServerThread) -> None:
    http = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    try:
        with triton_grpc.InferenceServerClient(server.grpc_target) as grpc:
            for client, module in [(http, triton_http), (grpc, triton_grpc)]:
                answer = ask(client, module, "scores", ROWS, 2)
                assert answer.tolist() == [
                    [b"3.300000:1:banana", b"2.400000:3:date"],
                    [b"9.000000:0:apple", b"8.000000:2:cherry"],
                ]
                unbatched = ask(client, module, "unbatched", ROWS[0], 3)
                assert unbatched.tolist() == [b"3.300000:1:banana", b"2.400000:3:date", b"1.100000:0:apple"]
        assert "classification" in http.get_server_metadata()["extensions"]
    finally:
        http.close()


def test_classification_over_a_grpc_stream(server: ServerThread) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with triton_grpc.InferenceServerClient(server.grpc_target) as grpc:
        grpc.start_stream(callback=lambda result, error: answers.put(error or result))
        tensor = triton_grpc.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(ROWS[:1])
        grpc.async_stream_infer("scores", [tensor], outputs=[triton_grpc.InferRequestedOutput("y", class_count=1)])
        result = answers.get(timeout=60)
        grpc.stop_stream()
    assert result.as_numpy("y").tolist() == [[b"3.300000:1:banana"]]


@pytest.mark.parametrize("count", [0, -1, "two", True])
def test_a_bad_classification_parameter_is_refused(server: ServerThread, count: Any) -> None:
    body = {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "y", "parameters": {"classification": count}}],
    }
    answer = requests.post(f"{server.rest_url}/v2/models/scores/infer", json=body, timeout=60)
    assert answer.status_code == 400
    assert 'classification parameter of output "y" must be a positive number' in answer.json()["error"]


def test_values_are_written_as_triton_writes_them_and_ties_keep_index_order() -> None:
    ints = top_classes(np.array([1, 5, 10, 5], np.int32), 3, [], batched=False, name="y")
    assert ints.tolist() == [b"10:2", b"5:1", b"5:3"]
    more_than_there_are = top_classes(np.array([[0.5, 0.25]], np.float64), 5, ["a"], batched=True, name="y")
    assert more_than_there_are.tolist() == [[b"0.500000:0:a", b"0.250000:1"]]
    with pytest.raises(Exception, match="cannot be ranked as classes"):
        top_classes(np.array([b"a"], object), 1, [], batched=False, name="y")


def test_a_label_file_that_is_missing_fails_the_load(tmp_path: Path) -> None:
    from workbench.core.errors import ServingError
    from workbench.platforms import triton
    from workbench.platforms.base import LoadPolicy

    (tmp_path / "m" / "1").mkdir(parents=True)
    onnx.save_model(identity_model(["batch", 4]), str(tmp_path / "m" / "1" / "model.onnx"))
    (tmp_path / "m" / "config.pbtxt").write_text(SCORES_CONFIG)
    with pytest.raises(ServingError) as refused:
        triton.load("m", 1, str(tmp_path / "m" / "1"), LoadPolicy())
    assert 'label_filename of output "y": cannot read' in str(refused.value)
