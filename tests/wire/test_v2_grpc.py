"""The Open Inference Protocol over gRPC, driven by Triton's own clients (``tritonclient.grpc`` and its aio form)
unchanged, on the same port as TF Serving's gRPC API; hand-built requests (typed contents, malformed raw data) go
through the generated stub itself."""

from __future__ import annotations

import asyncio
import shutil
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException
from waiting import place_atomically, wait_until

from workbench.config.options import ServerOptions
from workbench.core.errors import ServingError
from workbench.protocol import v2_grpc_messages, v2_models
from workbench.server import ServerThread


def save_doubler_fp16(export_dir: Path) -> Path:
    """A model on half floats: ``x`` float16 [None, 2] -> ``y`` = 2x (float16)."""

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float16, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x * tf.constant(2.0, tf.float16)}

    module = Doubler()
    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": module.serve})
    return export_dir


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    root = tmp_path_factory.mktemp("v2-grpc")
    shutil.copytree(model_store / "hp2_tf2", root / "hp" / "1")
    shutil.copytree(model_store / "multi_io", root / "multi_io" / "1")
    save_doubler_fp16(root / "half" / "1")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository))) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.grpc_target) as opened:
        yield opened


@pytest.fixture(scope="module")
def stub(server: ServerThread) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def tensor(name: str, value: np.ndarray, datatype: str) -> triton.InferInput:
    return triton.InferInput(name, list(value.shape), datatype).set_data_from_numpy(value)


def multi_io_inputs() -> list[triton.InferInput]:
    return [
        tensor("a", np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), "FP32"),
        tensor("b", np.array([10, 20], np.int64), "INT64"),
        tensor("text", np.array([b"ab", "c\u00e9".encode()], dtype=object), "BYTES"),
    ]


def grpc_code(call: Callable[[], Any]) -> tuple[str, str]:
    """The status code name and message a tritonclient call fails with."""
    with pytest.raises(InferenceServerException) as failed:
        call()
    return str(failed.value.status()).removeprefix("StatusCode."), failed.value.message()


def stub_code(call: Callable[[], Any]) -> tuple[str, str]:
    """The status code name and message a raw stub call fails with."""
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value.code().name, failed.value.details()


def hp_request(raw: bytes, shape: list[int], datatype: str = "FP32", name: str = "x") -> Any:
    request = service_pb2.ModelInferRequest(model_name="hp")
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    return request


# ================================================================================== the pure codec
def test_the_codec_reads_what_tritonclient_writes_and_tritonclient_reads_what_it_answers():
    inputs = multi_io_inputs()
    request = service_pb2.ModelInferRequest(model_name="m")
    for given in inputs:  # exactly the tensor and bytes tritonclient's infer() puts on the wire
        request.inputs.append(given._get_tensor())
        request.raw_input_contents.append(given._get_content())
    decoded = v2_grpc_messages.decode_inputs(request)
    np.testing.assert_array_equal(decoded["a"], [[1.0, 2.0], [3.0, 4.0]])
    assert decoded["a"].dtype == np.float32 and decoded["b"].dtype == np.int64
    assert decoded["text"].tolist() == [b"ab", "c\u00e9".encode()]

    outputs = {"t": np.array([[b"x", b""], [b"yz", b"\x00"]], dtype=object), "h": np.array([1.5], np.float16)}
    response = v2_grpc_messages.infer_response("m", "3", "id-1", outputs, ["t", "h"])
    result = triton.InferResult(response)
    assert result.as_numpy("t").tolist() == [[b"x", b""], [b"yz", b"\x00"]]
    assert result.as_numpy("h").dtype == np.float16 and result.as_numpy("h").tolist() == [1.5]
    assert result.get_response().model_version == "3" and result.get_response().id == "id-1"


def test_typed_contents_of_every_family_decode_and_small_integers_are_range_checked():
    request = service_pb2.ModelInferRequest(model_name="m")
    families = [
        ("BOOL", "bool_contents", [True, False], np.bool_),
        ("INT8", "int_contents", [-128, 127], np.int8),
        ("INT32", "int_contents", [-5, 5], np.int32),
        ("INT64", "int64_contents", [-(2**40), 2**40], np.int64),
        ("UINT16", "uint_contents", [0, 65535], np.uint16),
        ("UINT64", "uint64_contents", [0, 2**63], np.uint64),
        ("FP32", "fp32_contents", [0.5, -1.25], np.float32),
        ("FP64", "fp64_contents", [0.1, 1e300], np.float64),
        ("BYTES", "bytes_contents", [b"a", b""], object),
    ]
    for datatype, field, values, _ in families:
        tensor = request.inputs.add(name=datatype, datatype=datatype, shape=[2, 1])
        getattr(tensor.contents, field).extend(values)
    decoded = v2_grpc_messages.decode_inputs(request)
    for datatype, _, values, dtype in families:
        assert decoded[datatype].dtype == np.dtype(dtype) and decoded[datatype].shape == (2, 1)
        assert decoded[datatype].ravel().tolist() == values

    narrow = service_pb2.ModelInferRequest()
    narrow.inputs.add(name="n", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    with pytest.raises(ServingError, match='Input "n": a value in int_contents is out of the range of INT8'):
        v2_grpc_messages.decode_inputs(narrow)


def test_only_a_request_naming_a_shared_memory_region_needs_the_clients_regions():
    # ModelInfer reads (and parses) the client's address for such requests only; every other one skips it.
    plain = service_pb2.ModelInferRequest(model_name="m")
    plain.inputs.add(name="x", datatype="FP32", shape=[1]).parameters["binary_data_size"].int64_param = 4
    plain.outputs.add(name="y").parameters["classification"].int64_param = 1
    assert not v2_grpc_messages.names_shared_memory(plain)
    for where, key in [("inputs", "shared_memory_region"), ("outputs", "shared_memory_byte_size"),
                       ("outputs", "shared_memory_offset")]:  # fmt: skip
        request = service_pb2.ModelInferRequest()
        request.CopyFrom(plain)
        getattr(request, where).add(name="z").parameters[key].string_param = "r"
        assert v2_grpc_messages.names_shared_memory(request), (where, key)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", (None, None)), ("3", (3, None)), ("stable", (None, "stable")), ("-1", (None, "-1")), ("²", (None, "²"))],
)
def test_a_version_string_of_digits_is_a_version_and_any_other_a_label(text, expected):
    assert v2_models.parse_version(text) == expected


# ============================================================================ health and metadata
def test_health_readiness_and_metadata(client: triton.InferenceServerClient, server: ServerThread):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("hp")
    assert client.is_model_ready("hp", "1")
    assert not client.is_model_ready("hp", "7")
    assert not client.is_model_ready("nope")

    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "triton"  # as Triton's clients check
    assert {"model_repository", "statistics", "model_configuration"} <= set(metadata["extensions"])

    model = client.get_model_metadata("multi_io", as_json=True)
    assert model["name"] == "multi_io"
    assert model["platform"] == "tensorflow_savedmodel"
    assert model["versions"] == ["1"]
    assert {i["name"]: (i["datatype"], i["shape"]) for i in model["inputs"]} == {
        "a": ("FP32", ["-1", "2"]),  # proto3 JSON writes int64 as strings
        "b": ("INT64", ["-1"]),
        "text": ("BYTES", ["-1"]),
    }
    assert {o["name"]: o["datatype"] for o in model["outputs"]} == {
        "total": "FP32",
        "doubled": "INT64",
        "upper": "BYTES",
        "echo_bytes": "BYTES",
    }
    assert client.get_model_metadata("hp", "1").versions == ["1"]

    # grpc.health.v1 knows the v2 service by name and answers with the same readiness.
    with grpc.insecure_channel(server.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_model_config_describes_the_signature_as_triton_does(client: triton.InferenceServerClient):
    config = client.get_model_config("multi_io").config
    assert config.name == "multi_io"
    assert config.platform == "tensorflow_savedmodel"
    assert config.max_batch_size == 0  # batching is off on this server: dims keep the batch dimension
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("a", triton.model_config_pb2.TYPE_FP32, [-1, 2]),
        ("b", triton.model_config_pb2.TYPE_INT64, [-1]),
        ("text", triton.model_config_pb2.TYPE_STRING, [-1]),
    ]
    assert sorted(o.name for o in config.output) == ["doubled", "echo_bytes", "total", "upper"]


# ====================================================================================== inference
def test_infer_with_several_inputs_outputs_and_bytes(client: triton.InferenceServerClient):
    result = client.infer("multi_io", multi_io_inputs(), request_id="req-7")
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("multi_io", "1", "req-7")
    np.testing.assert_array_equal(result.as_numpy("total"), np.array([13.0, 27.0], np.float32))
    assert result.as_numpy("doubled").tolist() == [20, 40]
    assert result.as_numpy("doubled").dtype == np.int64
    assert result.as_numpy("upper").tolist() == [b"AB", "C\u00e9".encode()]
    assert result.as_numpy("echo_bytes").tolist() == [b"ab", "c\u00e9".encode()]


def test_requested_outputs_are_the_only_ones_answered_in_the_order_asked(client: triton.InferenceServerClient):
    outputs = [triton.InferRequestedOutput("upper"), triton.InferRequestedOutput("doubled")]
    result = client.infer("multi_io", multi_io_inputs(), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["upper", "doubled"]
    assert result.as_numpy("doubled").tolist() == [20, 40]
    assert result.as_numpy("total") is None


def test_fp16_travels_raw_both_ways(client: triton.InferenceServerClient):
    x = np.array([[0.5, -1.5], [2.0, 1024.0]], np.float16)
    result = client.infer("half", [tensor("x", x, "FP16")])
    assert result.get_output("y").datatype == "FP16"
    y = result.as_numpy("y")
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, x * 2)


def test_typed_contents_are_accepted_as_well_as_raw(stub: service_pb2_grpc.GRPCInferenceServiceStub):
    request = service_pb2.ModelInferRequest(model_name="multi_io", model_version="1")
    request.inputs.add(name="a", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.5, 2.5])
    request.inputs.add(name="b", datatype="INT64", shape=[1]).contents.int64_contents.append(7)
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hi")
    result = triton.InferResult(stub.ModelInfer(request, timeout=30))
    assert result.as_numpy("total").tolist() == [11.0]
    assert result.as_numpy("upper").tolist() == [b"HI"]


def test_the_aio_client_does_the_same(server: ServerThread):
    async def main() -> dict[str, Any]:
        async with triton_aio.InferenceServerClient(server.grpc_target) as aio:
            answers = await asyncio.gather(
                *(aio.infer("hp", [tensor("x", np.array([[float(i)]], np.float32), "FP32")]) for i in range(8))
            )
            return {
                "live": await aio.is_server_live(),
                "ready": await aio.is_model_ready("multi_io"),
                "metadata": await aio.get_model_metadata("hp", as_json=True),
                "y": [answer.as_numpy("y").item() for answer in answers],
                "error": await _aio_error(aio.infer("nope", [tensor("x", np.zeros((1, 1), np.float32), "FP32")])),
            }

    answer = asyncio.run(main())
    assert answer["live"] and answer["ready"]
    assert answer["metadata"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "1"]}]
    assert answer["y"] == [0.5 * i + 2 for i in range(8)]
    assert answer["error"] == "StatusCode.NOT_FOUND"


async def _aio_error(call: Any) -> str:
    try:
        await call
    except InferenceServerException as exc:
        return str(exc.status())
    return "no error"


def test_tf_serving_grpc_answers_on_the_same_port(server: ServerThread, client: triton.InferenceServerClient):
    with grpc.insecure_channel(server.grpc_target) as channel:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "hp"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[4.0]], np.float32)))
        tf_answer = tf.make_ndarray(predict.Predict(request, 30).outputs["y"])
    v2_answer = client.infer("hp", [tensor("x", np.array([[4.0]], np.float32), "FP32")]).as_numpy("y")
    np.testing.assert_array_equal(tf_answer, v2_answer)
    assert v2_answer.tolist() == [[4.0]]


# ========================================================================================= errors
def test_inference_errors_have_precise_codes(client: triton.InferenceServerClient):
    x = tensor("x", np.array([[1.0]], np.float32), "FP32")
    assert grpc_code(lambda: client.infer("nope", [x]))[0] == "NOT_FOUND"
    assert grpc_code(lambda: client.infer("hp", [x], model_version="9"))[0] == "NOT_FOUND"
    code, message = grpc_code(lambda: client.infer("hp", [x], model_version="nolabel"))
    assert (code, message) == (
        "INVALID_ARGUMENT",
        "failed to get model version from specified version string 'nolabel': it is neither a version number nor a "
        "version label of model hp",
    )

    wrong_type = tensor("x", np.array([[1]], np.int32), "INT32")
    code, message = grpc_code(lambda: client.infer("hp", [wrong_type]))
    assert code == "INVALID_ARGUMENT" and '"x"' in message and "float" in message
    rows_disagree = [*multi_io_inputs()[::2], tensor("b", np.array([1, 2, 3], np.int64), "INT64")]
    code, message = grpc_code(lambda: client.infer("multi_io", rows_disagree))
    assert code == "INVALID_ARGUMENT", message
    code, message = grpc_code(lambda: client.infer("hp", [tensor("z", np.ones((1, 1), np.float32), "FP32")]))
    assert code == "INVALID_ARGUMENT" and "z" in message
    code, message = grpc_code(lambda: client.infer("multi_io", multi_io_inputs()[:2]))
    assert code == "INVALID_ARGUMENT" and "text" in message
    code, message = grpc_code(lambda: client.infer("hp", [x], outputs=[triton.InferRequestedOutput("nope")]))
    assert code == "INVALID_ARGUMENT" and "nope" in message
    code, message = grpc_code(lambda: client.infer("hp", [x], outputs=[triton.InferRequestedOutput("y")] * 2))
    assert code == "INVALID_ARGUMENT" and "duplicate" in message
    shared = triton.InferInput("x", [1, 1], "FP32")
    shared.set_shared_memory("region", 4)  # tests/wire/test_v2_shared_memory.py registers regions and uses them
    code, message = grpc_code(lambda: client.infer("hp", [shared]))
    assert code == "INVALID_ARGUMENT" and "shared memory region 'region' is not registered" in message


def test_malformed_raw_and_typed_data_is_invalid_argument_naming_the_input(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
):
    def infer(request: Any) -> Any:
        return stub.ModelInfer(request, timeout=30)

    cases: list[tuple[Any, str]] = [
        (hp_request(b"\x00" * 12, [2, 1]), 'Input "x": shape [2,1] of FP32 takes 8 bytes but raw_input_contents'),
        (hp_request(b"\x00" * 4, [1, -1]), 'Input "x": shape [1,-1] has a negative dimension'),
        (hp_request(b"\x00" * 4, [1, 1], "FP8"), "Input \"x\": Unknown datatype 'FP8'"),
    ]
    two_raw = hp_request(b"\x00" * 4, [1, 1])
    two_raw.raw_input_contents.append(b"\x00" * 4)
    cases.append((two_raw, "raw_input_contents holds 2 buffers for 1 inputs"))
    both = hp_request(b"\x00" * 4, [1, 1])
    both.inputs[0].contents.fp32_contents.append(1.0)
    cases.append((both, "contents field must not be specified when using raw_input_contents for 'x' for model 'hp'"))
    nothing = service_pb2.ModelInferRequest(model_name="hp")
    nothing.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    cases.append((nothing, "unable to find data for input tensor 'x' for model 'hp' in request."))
    shared_and_typed = service_pb2.ModelInferRequest(model_name="hp")
    shared_input = shared_and_typed.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    shared_input.parameters["shared_memory_region"].string_param = "region"
    shared_input.parameters["shared_memory_byte_size"].int64_param = 4
    shared_input.contents.fp32_contents.append(1.0)
    cases.append(
        (shared_and_typed, "unexpected 'content' provided when using shared memory for input tensor 'x' for model 'hp'")
    )
    short = service_pb2.ModelInferRequest(model_name="hp")
    short.inputs.add(name="x", datatype="FP32", shape=[2, 1]).contents.fp32_contents.append(1.0)
    cases.append((short, 'Input "x": shape [2,1] holds 2 elements but 1 were sent'))
    misplaced = service_pb2.ModelInferRequest(model_name="hp")
    misplaced.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp64_contents.append(1.0)
    cases.append(
        (
            misplaced,
            "unexpected explicit tensor data for input tensor 'x' for model 'hp' of type 'FP64', expected datatype "
            "'FP32'",
        )
    )
    half_typed = service_pb2.ModelInferRequest(model_name="half")
    half_typed.inputs.add(name="x", datatype="FP16", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    cases.append(
        (
            half_typed,
            "unexpected explicit tensor data for input tensor 'x' for model 'half' of type 'FP32', expected datatype "
            "'FP16'",
        )
    )
    half_empty = service_pb2.ModelInferRequest(model_name="half")
    half_empty.inputs.add(name="x", datatype="FP16", shape=[1, 2]).contents.SetInParent()
    cases.append((half_empty, 'Input "x": FP16 tensors have no typed contents; send them raw'))
    twice = hp_request(b"\x00" * 4, [1, 1])
    twice.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    twice.raw_input_contents.append(b"\x00" * 4)
    cases.append((twice, 'Input "x" is sent more than once'))

    text_input = [("a", "FP32", [1, 2], np.ones((1, 2), np.float32).tobytes()), ("b", "INT64", [1], b"\x00" * 8)]

    def multi(text_raw: bytes, count: int) -> Any:
        request = service_pb2.ModelInferRequest(model_name="multi_io")
        for name, datatype, shape, raw in [*text_input, ("text", "BYTES", [count], text_raw)]:
            request.inputs.add(name=name, datatype=datatype, shape=shape)
            request.raw_input_contents.append(raw)
        return request

    cases.append((multi(struct.pack("<I", 5) + b"abc", 1), 'Input "text": a raw BYTES element says it has 5 bytes'))
    # Triton's own example (grpc_explicit_int_content_client.py): typed contents on the first input beside one raw
    # buffer. Triton reads the inputs in order and names the first that carries contents.
    mixed = service_pb2.ModelInferRequest(model_name="multi_io")
    mixed.inputs.add(name="a", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    mixed.inputs.add(name="b", datatype="INT64", shape=[1]).contents.int64_contents.append(1)
    mixed.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"ab")
    mixed.raw_input_contents.append(np.ones((1, 2), np.float32).tobytes())
    cases.append((mixed, "contents field must not be specified when using raw_input_contents for 'a' for model"))
    too_few = multi(struct.pack("<I", 2) + b"ab", 1)
    del too_few.raw_input_contents[2]
    cases.append((too_few, "unable to find data for input tensor 'text' for model 'multi_io' in request."))
    cases.append((multi(b"\x01\x00", 1), 'Input "text": its raw BYTES data ends inside an element'))
    cases.append((multi(struct.pack("<I", 1) + b"a", 2), 'Input "text": shape [2] holds 2 elements but 1 were sent'))

    for request, expected in cases:
        code, message = stub_code(lambda request=request: infer(request))
        assert code == "INVALID_ARGUMENT", (expected, message)
        assert expected in message

    # The same inputs, well formed, are answered: the cases above fail for the reason they name.
    assert triton.InferResult(infer(multi(struct.pack("<I", 2) + b"ab", 1))).as_numpy("upper").tolist() == [b"AB"]


def test_descriptive_calls_fail_with_precise_codes(client: triton.InferenceServerClient, stub: Any):
    assert grpc_code(lambda: client.get_model_metadata("nope"))[0] == "NOT_FOUND"
    assert grpc_code(lambda: client.get_model_metadata("hp", "5"))[0] == "NOT_FOUND"
    assert grpc_code(lambda: client.get_model_config("nope"))[0] == "NOT_FOUND"
    assert grpc_code(lambda: client.get_inference_statistics("nope"))[0] == "NOT_FOUND"
    assert grpc_code(lambda: client.get_inference_statistics("hp", "5"))[0] == "NOT_FOUND"
    code, message = stub_code(lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=""), timeout=10))
    assert (code, message) == ("INVALID_ARGUMENT", "A model name is required")
    index = service_pb2.RepositoryIndexRequest(repository_name="elsewhere")
    assert stub_code(lambda: stub.RepositoryIndex(index, timeout=10))[0] == "NOT_FOUND"
    assert grpc_code(lambda: client.get_trace_settings())[0] == "UNIMPLEMENTED"


# ====================================================================================== statistics
def test_statistics_count_requests_and_runs(client: triton.InferenceServerClient):
    before = client.get_inference_statistics("hp", "1").model_stats[0]
    for i in range(3):
        client.infer("hp", [tensor("x", np.full((2, 1), float(i), np.float32), "FP32")])
    stats = client.get_inference_statistics("hp", "1", as_json=True)["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("hp", "1")]
    after = client.get_inference_statistics("hp", "1").model_stats[0]
    assert after.inference_count - before.inference_count == 6  # rows
    assert after.execution_count - before.execution_count == 3  # model runs
    assert after.inference_stats.success.count - before.inference_stats.success.count == 3
    assert after.inference_stats.success.ns > before.inference_stats.success.ns
    every = client.get_inference_statistics().model_stats
    assert {(s.name, s.version) for s in every} == {("hp", "1"), ("multi_io", "1"), ("half", "1")}


# ================================================================================= versions, labels
def management(server: ServerThread, path: str, body: dict[str, Any]) -> None:
    answer = requests.post(f"{server.rest_url}/workbench/v1/models/{path}", json=body, timeout=120)
    assert answer.status_code == 200, answer.text


def test_a_version_by_number_or_by_label_and_the_default_traffic(serve: Callable[..., ServerThread], make_repo):
    base = make_repo("hp", {1: "hp2_tf2", 2: "hp3_tf2"})  # y = x/2 + 2 and y = x/2 + 3
    server = serve(model_repository=str(base.parent))
    x = [tensor("x", np.array([[2.0]], np.float32), "FP32")]

    with triton.InferenceServerClient(server.grpc_target) as client:

        def answer(version: str = "") -> tuple[str, float]:
            result = client.infer("hp", x, model_version=version)
            return result.get_response().model_version, result.as_numpy("y").item()

        wait_until(lambda: client.is_model_ready("hp"), what="hp ready")
        assert answer() == ("2", 4.0)  # TF Serving's default: the latest version
        management(server, "hp:promote", {"version": 1})
        assert answer() == ("1", 3.0)
        assert answer("stable") == ("1", 3.0)
        assert answer("2") == ("2", 4.0)
        management(server, "hp:canary", {"version": 2, "weight": 1.0})
        assert answer("canary") == ("2", 4.0)
        assert answer() == ("2", 4.0)  # all of the default traffic goes to the canary
        assert client.is_model_ready("hp", "canary")
        assert not client.is_model_ready("hp", "nolabel")
        assert client.get_model_metadata("hp", "stable").versions == ["1", "2"]  # the versions that serve
        stats = client.get_inference_statistics("hp", "canary").model_stats
        assert [(s.version, s.execution_count) for s in stats] == [("2", 4)]


# ======================================================================================== batching
METRICS_PATH = "/monitoring/prometheus/metrics"


def metric(server: ServerThread, name: str, **labels: str) -> float | None:
    """One sample of the server's Prometheus metrics (None when it has none yet)."""
    text = requests.get(server.rest_url + METRICS_PATH, timeout=30).text
    found = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def test_v2_requests_are_batched_with_the_models_batching_parameters(serve, make_repo, tmp_path: Path):
    base = make_repo("batched", {1: "hp2_tf2"})
    (base / "batching_parameters.txt").write_text(
        "max_batch_size { value: 8 } batch_timeout_micros { value: 30000000 } num_batch_threads { value: 1 }\n"
    )
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}\n')
    server = serve(model_repository=str(base.parent), monitoring_config_file=str(monitoring))

    with triton.InferenceServerClient(server.grpc_target) as client:
        assert client.get_model_config("batched").config.max_batch_size == 8

        def call(i: int) -> float:
            x = tensor("x", np.array([[float(i)]], np.float32), "FP32")
            return client.infer("batched", [x], client_timeout=60).as_numpy("y").item()

        # Seven single-row requests wait (the batch holds 8, the timeout is 30 s); the eighth fills the batch and
        # one model run answers all eight, each with its own row.
        with ThreadPoolExecutor(max_workers=8) as pool:
            first = [pool.submit(call, i) for i in range(7)]
            wait_until(lambda: metric(server, "workbench_queue_depth", model="batched") == 7, what="7 queued rows")
            assert not any(f.done() for f in first)
            last = pool.submit(call, 7)
            assert [f.result(timeout=60) for f in [*first, last]] == [0.5 * i + 2 for i in range(8)]

        stats = client.get_inference_statistics("batched", as_json=True)["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == ("8", "1")
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [("8", "1")]
    assert stats["inference_stats"]["success"]["count"] == "8"
    # The server's metrics say the same, and count the requests under their protocol.
    assert metric(server, "workbench_batch_size_count", model="batched") == 1
    assert metric(server, "workbench_batch_size_bucket", model="batched", le="4.0") == 0
    assert metric(server, "workbench_batch_size_bucket", model="batched", le="8.0") == 1
    requests_total = "workbench_requests_total"
    assert metric(server, requests_total, model="batched", protocol="v2-grpc", code="OK", api="predict") == 8


# ================================================================================ model repository
def version_parameter(**value: Any) -> dict[str, service_pb2.ModelRepositoryParameter]:
    return {"version": service_pb2.ModelRepositoryParameter(**value)}


def test_repository_unload_removes_a_models_only_version(serve, make_repo):
    """Triton's unload means "remove it": a model's only version goes (workbench's own :unload keeps it); the
    model then answers NOT_FOUND, the server stays ready (gRPC health too), and a load brings the version back."""
    server = serve(model_repository=str(make_repo("hp", {1: "hp2_tf2"}).parent))
    x = [tensor("x", np.array([[2.0]], np.float32), "FP32")]
    with triton.InferenceServerClient(server.grpc_target) as client, grpc.insecure_channel(server.grpc_target) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        unload = service_pb2.RepositoryModelUnloadRequest(
            model_name="hp", parameters=version_parameter(string_param="1")
        )
        stub.RepositoryModelUnload(unload, timeout=120)
        assert not client.is_model_ready("hp", "1") and not client.is_model_ready("hp")
        code, message = grpc_code(lambda: client.infer("hp", x))
        assert (code, message) == ("NOT_FOUND", "Servable not found for request: Latest(hp)")
        assert client.is_server_ready()
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING

        load = service_pb2.RepositoryModelLoadRequest(model_name="hp", parameters=version_parameter(int64_param=1))
        stub.RepositoryModelLoad(load, timeout=120)
        assert client.infer("hp", x).get_response().model_version == "1"


def test_repository_index_load_and_unload_act_on_versions(serve, make_repo, model_store: Path):
    base = make_repo("hp", {1: "hp2_tf2", 2: "hp3_tf2"})
    server = serve(model_repository=str(base.parent), management_token="s3cret", file_system_poll_wait_seconds=0)
    auth = {"authorization": "Bearer s3cret"}

    def index(client: triton.InferenceServerClient, ready: bool = False) -> list[tuple[str, str, str]]:
        models = client.get_model_repository_index(as_json=True, headers=auth).get("models", [])
        listed = [(m["name"], m["version"], m["state"]) for m in models]
        return listed if not ready else [m for m in listed if m[2] == "READY"]

    with triton.InferenceServerClient(server.grpc_target) as client, grpc.insecure_channel(server.grpc_target) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        assert index(client) == [("hp", "2", "READY")]  # the version policy serves the latest

        load = service_pb2.RepositoryModelLoadRequest(model_name="hp", parameters=version_parameter(int64_param=1))
        assert stub_code(lambda: stub.RepositoryModelLoad(load, timeout=60)) == (
            "UNAUTHENTICATED",
            "Repository load and unload need the server's management token",
        )
        stub.RepositoryModelLoad(load, timeout=120, metadata=tuple(auth.items()))
        assert client.is_model_ready("hp", "1")
        assert index(client) == [("hp", "1", "READY"), ("hp", "2", "READY")]

        unload = service_pb2.RepositoryModelUnloadRequest(
            model_name="hp", parameters=version_parameter(string_param="1")
        )
        stub.RepositoryModelUnload(unload, timeout=120, metadata=tuple(auth.items()))
        wait_until(lambda: not client.is_model_ready("hp", "1"), what="version 1 unloaded")
        assert index(client, ready=True) == [("hp", "2", "READY")]

        # Without a version, a load re-reads the model's folder and answers once what it found serves.
        place_atomically(model_store / "hp2_tf2", base / "3")  # no polling on this server: only a load finds it
        client.load_model("hp", headers=auth)
        assert client.is_model_ready("hp", "3")
        assert (
            client.infer("hp", [tensor("x", np.array([[2.0]], np.float32), "FP32")]).get_response().model_version == "3"
        )

        assert grpc_code(lambda: client.unload_model("hp", headers=auth))[0] == "FAILED_PRECONDITION"
        assert grpc_code(lambda: client.load_model("nope", headers=auth))[0] == "NOT_FOUND"
        code, message = grpc_code(lambda: client.load_model("hp", headers=auth, config='{"max_batch_size": 4}'))
        assert code == "INVALID_ARGUMENT" and "config" in message
        bad = service_pb2.RepositoryModelLoadRequest(model_name="hp", parameters=version_parameter(string_param="v1"))
        code, message = stub_code(lambda: stub.RepositoryModelLoad(bad, timeout=60, metadata=tuple(auth.items())))
        assert (code, message) == ("INVALID_ARGUMENT", "The version parameter must be a version number, got 'v1'")
        missing = service_pb2.RepositoryModelLoadRequest(model_name="hp", parameters=version_parameter(int64_param=9))
        assert stub_code(lambda: stub.RepositoryModelLoad(missing, timeout=60, metadata=tuple(auth.items())))[0] == (
            "NOT_FOUND"
        )
