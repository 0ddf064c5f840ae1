"""TF Serving's gRPC API driven by the real tensorflow-serving-api stubs, exactly as TF Serving clients call it."""

from __future__ import annotations

import shutil
import threading

import grpc
import models  # (tests/models.py)
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from tensorflow_serving.config import model_server_config_pb2

from workbench.config.options import ServerOptions
from workbench.server import ServerThread


def write_config(path, models: dict[str, str], labels: dict[str, dict[str, int]] | None = None) -> None:
    config = model_server_config_pb2.ModelServerConfig()
    for name, base in models.items():
        entry = config.model_config_list.config.add(name=name, base_path=str(base), model_platform="tensorflow")
        entry.model_version_policy.all.SetInParent()
        for label, version in (labels or {}).get(name, {}).items():
            entry.version_labels[label] = version
    from google.protobuf import text_format

    path.write_text(text_format.MessageToString(config))


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_store):
    root = tmp_path_factory.mktemp("grpc")
    shutil.copytree(model_store / "hp2_tf1", root / "tf1" / "1")
    shutil.copytree(model_store / "hp2_tf1", root / "tf1" / "2")
    shutil.copytree(model_store / "hp2_tf2", root / "tf2" / "1")
    shutil.copytree(model_store / "multi_io", root / "multi" / "1")
    models.save_dense(root / "dense" / "1")
    config = root / "models.config"
    names = ("tf1", "tf2", "multi", "dense")
    write_config(config, {n: root / n for n in names}, labels={"tf1": {"stable": 1, "canary": 2}})
    options = ServerOptions(
        rest_api_port=0,
        port=0,
        model_config_file=str(config),
        grpc_socket_path=str(root / "grpc.sock"),
        grpc_max_message_bytes=4 * 1024 * 1024,
    )
    with ServerThread(options) as running:
        running.socket_path = root / "grpc.sock"
        yield running


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc_target) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def predict_request(model: str, signature: str = "", **inputs) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if signature:
        request.model_spec.signature_name = signature
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return request


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, 10.0)
    return info.value


@pytest.mark.parametrize("model", ["tf1", "tf2"])
def test_predict_exactly_as_tf_serving_clients_do(stub, model):
    request = predict_request(model, x=np.array([[2.0], [3.0], [4.0]], np.float32))
    response = stub.Predict(request, 10.0)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["y"]), [[3.0], [3.5], [4.0]])
    # Typed fields, as TF Serving answers by default, for clients that read float_val directly.
    assert list(response.outputs["y"].float_val) == [3.0, 3.5, 4.0]
    assert response.model_spec.name == model
    assert response.model_spec.signature_name == "serving_default"
    assert response.model_spec.version.value == (2 if model == "tf1" else 1)


def typed_request(rows: int, values: list[float]) -> predict_pb2.PredictRequest:
    """A Predict for tf1 whose x ([rows, 1] float32) is sent in float_val, not tensor_content."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tf1"
    tensor = request.inputs["x"]
    tensor.dtype = tf.float32.as_datatype_enum
    tensor.tensor_shape.dim.add().size = rows
    tensor.tensor_shape.dim.add().size = 1
    tensor.float_val.extend(values)
    return request


def test_predict_accepts_typed_value_fields(stub):
    response = stub.Predict(typed_request(2, [1.0, 5.0]), 10.0)
    assert list(response.outputs["y"].float_val) == [2.5, 4.5]


@pytest.mark.parametrize("sent", [200, 150])  # every value; fewer than the shape holds (the last one repeats)
def test_many_typed_values_both_ways(stub, sent):
    """Long float_val fields (read and written as wire bytes) come and go exactly as typed values do."""
    values = np.arange(sent, dtype=np.float32)
    response = stub.Predict(typed_request(200, values.tolist()), 10.0)
    full = np.concatenate([values, np.full(200 - sent, values[-1], np.float32)])
    expected = tf.make_tensor_proto(full.reshape(200, 1) / 2 + 2)  # half_plus_two, as typed fields
    expected.ClearField("tensor_content")
    expected.float_val.extend((full / 2 + 2).tolist())
    assert response.outputs["y"].SerializeToString() == expected.SerializeToString()


def test_predict_by_version_and_by_label(stub):
    request = predict_request("tf1", x=np.array([[1.0]], np.float32))
    request.model_spec.version.value = 1
    assert stub.Predict(request, 10.0).model_spec.version.value == 1
    request.model_spec.version_label = "canary"
    assert stub.Predict(request, 10.0).model_spec.version.value == 2


def test_multiple_inputs_outputs_strings_and_output_filter(stub):
    request = predict_request(
        "multi",
        a=np.array([[1.0, 2.0], [3.0, 4.0]], np.float32),
        b=np.array([1, 2], np.int64),
        text=np.array([b"ab", b"\x00\xff"], dtype=object),
    )
    response = stub.Predict(request, 10.0)
    assert sorted(response.outputs) == ["doubled", "echo_bytes", "total", "upper"]
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["total"]), [4.0, 9.0])
    assert list(response.outputs["doubled"].int64_val) == [2, 4]
    assert list(response.outputs["echo_bytes"].string_val) == [b"ab", b"\x00\xff"]
    request.output_filter.extend(["upper"])
    filtered = stub.Predict(request, 10.0)
    assert list(filtered.outputs) == ["upper"]
    assert list(filtered.outputs["upper"].string_val) == [b"AB", b"\x00\xff"]


@pytest.mark.parametrize(
    ("mutate", "code", "message"),
    [
        (
            lambda r: setattr(r.model_spec, "signature_name", "nope"),
            grpc.StatusCode.FAILED_PRECONDITION,
            'Serving signature key "nope" not found.',
        ),
        (
            lambda r: setattr(r.model_spec, "name", "nope"),
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Latest(nope)",
        ),
        (
            lambda r: r.model_spec.version.__setattr__("value", 9),
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Specific(tf1, 9)",
        ),
        (
            lambda r: setattr(r.model_spec, "version_label", "zzz"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Unrecognized servable version label: zzz",
        ),
        (
            lambda r: r.output_filter.extend(["nope"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "output tensor alias not found in signature: nope",
        ),
        (
            lambda r: r.output_filter.extend(["y", "y"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "duplicate output tensor alias: y",
        ),
        (
            lambda r: r.inputs["extra"].CopyFrom(tf.make_tensor_proto([1.0])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input size does not match signature: 2!=1 len({extra,x}) != len({x}). Sent extra: {extra}.",
        ),
        (
            lambda r: r.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.float64)),
            grpc.StatusCode.INVALID_ARGUMENT,
            'Input "x" expects float [-1,1] but received double [1,1]: Expects arg[x] to be float but double is '
            "provided",
        ),
        (
            lambda r: r.inputs["x"].CopyFrom(tf.make_tensor_proto([b"a"])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "to be float but string is provided",
        ),
    ],
)
def test_predict_errors_match_tf_serving(stub, mutate, code, message):
    request = predict_request("tf1", x=np.array([[1.0]], np.float32))
    mutate(request)
    error = rpc_error(stub.Predict, request)
    assert error.code() == code
    assert message in error.details()


def test_missing_input(stub):
    request = predict_request("multi", a=np.zeros((1, 2), np.float32))
    error = rpc_error(stub.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input size does not match signature: 1!=3 len({a}) != len({a,b,text}). Sent extra: {}. Missing but "
        "required: {b,text}. Signature inputs: a float [-1,2], b int64 [-1], text string [-1]."
    )


# ------------------------------------------------------------------------ errors name the input (issue 13)
def test_a_tensor_of_another_shape_than_declared_is_named_when_tensorflow_refuses_it(stub):
    error = rpc_error(stub.Predict, predict_request("dense", features=np.ones((1, 3), np.float32)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(
        'Input "features" expects float [-1,4] but received float [1,3]: Matrix size-incompatible: In[0]: [1,3], '
        "In[1]: [4,2]"
    )
    response = stub.Predict(predict_request("dense", features=np.ones((1, 4), np.float32)), 10.0)
    assert tf.make_ndarray(response.outputs["logits"]).tolist() == [[4.0, 8.0]]


def test_a_malformed_tensor_proto_names_the_input(stub):
    request = predict_request("tf1")
    tensor = request.inputs["x"]
    tensor.dtype = tf.float32.as_datatype_enum
    tensor.tensor_shape.dim.add(size=2)
    tensor.tensor_shape.dim.add(size=3)
    tensor.float_val.extend([1.0] * 7)  # seven values for six places
    error = rpc_error(stub.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        'Input "x" expects float [-1,1] but received a malformed TensorProto (DT_FLOAT [2,3]): Could not parse '
        "input tensor x: 7 values do not fit the shape [2, 3]"
    )


def test_regress_on_a_float_input_tensor_names_the_input(stub):
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "tf1"
    request.model_spec.signature_name = "regress_x2_to_y3"
    request.input.example_list.examples.extend(examples(1.0))
    error = rpc_error(stub.Regress, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        'Input "inputs" expects float [-1,1] but received 1 serialized tf.Example(s): signature regress_x2_to_y3 '
        "does not read tf.Examples; send its input to :predict"
    )


def examples(*values: float) -> list[tf.train.Example]:
    return [
        tf.train.Example(
            features=tf.train.Features(feature={"x": tf.train.Feature(float_list=tf.train.FloatList(value=[v]))})
        )
        for v in values
    ]


def test_classify_regress_and_multi_inference(stub):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "tf1"
    request.model_spec.signature_name = "classify_x_to_y"
    request.input.example_list.examples.extend(examples(2.0, 4.0))
    response = stub.Classify(request, 10.0)
    assert [[(c.label, c.score) for c in row.classes] for row in response.result.classifications] == [
        [("", 3.0)],
        [("", 4.0)],
    ]
    assert response.model_spec.signature_name == "classify_x_to_y"

    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "tf1"
    request.model_spec.signature_name = "regress_x_to_y2"
    context = request.input.example_list_with_context
    context.context.features.feature["x"].float_list.value.append(4.0)
    context.examples.add()  # takes x from the context
    context.examples.extend(examples(2.0))
    response = stub.Regress(request, 10.0)
    assert [r.value for r in response.result.regressions] == [5.0, 4.0]

    request = inference_pb2.MultiInferenceRequest()
    for signature, method in (
        ("classify_x_to_y", "tensorflow/serving/classify"),
        ("regress_x_to_y", "tensorflow/serving/regress"),
    ):
        task = request.tasks.add()
        task.model_spec.name = "tf1"
        task.model_spec.signature_name = signature
        task.method_name = method
    request.input.example_list.examples.extend(examples(2.0))
    response = stub.MultiInference(request, 10.0)
    assert response.results[0].classification_result.classifications[0].classes[0].score == 3.0
    assert response.results[1].regression_result.regressions[0].value == 3.0
    assert [r.model_spec.signature_name for r in response.results] == ["classify_x_to_y", "regress_x_to_y"]


def test_classify_errors(stub):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "tf1"
    request.model_spec.signature_name = "nope"
    request.input.example_list.examples.extend(examples(1.0))
    error = rpc_error(stub.Classify, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "No signature was found with the name: nope"
    request.model_spec.signature_name = "classify_x_to_y"
    request.input.Clear()
    assert rpc_error(stub.Classify, request).details() == "Input is empty."


def test_model_metadata(stub):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "tf1"
    error = rpc_error(stub.GetModelMetadata, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, 10.0)
    assert response.model_spec.name == "tf1" and response.model_spec.version.value == 2
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    assert signatures.signature_def["serving_default"].inputs["x"].name == "x:0"
    assert signatures.signature_def["classify_x_to_y"].method_name == "tensorflow/serving/classify"
    request.metadata_field.append("graph")
    assert "Metadata field graph is not supported" in rpc_error(stub.GetModelMetadata, request).details()


def test_model_status(channel):
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "tf1"
    response = models.GetModelStatus(request, 10.0)
    assert [(s.version, s.state) for s in response.model_version_status] == [
        (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
    ]
    request.model_spec.version_label = "stable"
    assert [s.version for s in models.GetModelStatus(request, 10.0).model_version_status] == [1]
    request.model_spec.name = "nope"
    request.model_spec.ClearField("version_label")
    error = rpc_error(models.GetModelStatus, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "Could not find any versions of model nope"


def test_health_service(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_unix_socket(server):
    with grpc.insecure_channel(f"unix:{server.socket_path}") as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        response = stub.Predict(predict_request("tf2", x=np.array([[0.0]], np.float32)), 10.0)
        assert list(response.outputs["y"].float_val) == [2.0]


def test_message_size_limit(stub):
    # A 784-float image batch of 1,000 (3 MB) fits under the 4 MiB limit this server was given...
    images = predict_request("tf2", x=np.zeros((784 * 1000, 1), np.float32))
    assert len(stub.Predict(images, 30.0).outputs["y"].float_val) == 784 * 1000
    # ...while 8 MB is refused clearly, with RESOURCE_EXHAUSTED.
    too_big = predict_request("tf2", x=np.zeros((2_000_000, 1), np.float32))
    error = rpc_error(stub.Predict, too_big)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_reload_config_swaps_models_while_a_client_keeps_predicting(tmp_path, model_store):
    for name, stored in (("stay", "hp2_tf2"), ("old", "hp2_tf1"), ("new", "hp3_tf2")):
        shutil.copytree(model_store / stored, tmp_path / name / "1")
    config = tmp_path / "models.config"
    write_config(config, {"stay": tmp_path / "stay", "old": tmp_path / "old"})
    with ServerThread(ServerOptions(rest_api_port=0, port=0, model_config_file=str(config))) as running:
        with grpc.insecure_channel(running.grpc_target) as ch:
            predictions = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            models = model_service_pb2_grpc.ModelServiceStub(ch)
            request = predict_request("stay", x=np.array([[2.0]], np.float32))
            stop, failures, answered = threading.Event(), [], [0]

            def keep_predicting() -> None:
                while not stop.is_set():
                    try:
                        predictions.Predict(request, 10.0)
                        answered[0] += 1
                    except grpc.RpcError as exc:  # pragma: no cover - the assertion below reports it
                        failures.append(exc)

            client = threading.Thread(target=keep_predicting)
            client.start()
            try:
                reload = model_management_pb2.ReloadConfigRequest()
                for name in ("stay", "new"):
                    reload.config.model_config_list.config.add(
                        name=name, base_path=str(tmp_path / name), model_platform="tensorflow"
                    )
                entry = reload.config.model_config_list.config[0]
                entry.version_labels["stable"] = 1
                response = models.HandleReloadConfigRequest(reload, 60.0)
                assert response.status.error_code == 0
            finally:
                stop.set()
                client.join()
            assert failures == [] and answered[0] > 0
            new = predictions.Predict(predict_request("new", x=np.array([[2.0]], np.float32)), 10.0)
            assert list(new.outputs["y"].float_val) == [4.0]
            error = rpc_error(predictions.Predict, predict_request("old", x=np.array([[2.0]], np.float32)))
            assert error.code() == grpc.StatusCode.NOT_FOUND
            labelled = predict_request("stay", x=np.array([[2.0]], np.float32))
            labelled.model_spec.version_label = "stable"
            assert predictions.Predict(labelled, 10.0).model_spec.version.value == 1

            bad = model_management_pb2.ReloadConfigRequest()
            bad.config.model_config_list.config.add(name="stay", base_path=str(tmp_path / "stay"))
            bad.config.model_config_list.config.add(name="stay", base_path=str(tmp_path / "stay"))
            error = rpc_error(models.HandleReloadConfigRequest, bad)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "multiple times" in error.details()
