"""The REST :classify and :regress APIs on real TF1 and TF2 half_plus_two models: results, tf.Example JSON, errors."""

from __future__ import annotations

import json
import math

import grpc
import models  # (tests/models.py)
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from workbench.core.errors import ServingError
from workbench.protocol.examples import input_from_json, serialized_examples


def post(server, path: str, body) -> requests.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(server.rest_url + path, data=data, timeout=30)


@pytest.fixture
def tf1(serve, make_repo):
    return serve(model_name="hp", model_base_path=str(make_repo("hp", {1: "hp2_tf1"})))


@pytest.fixture
def tf2(serve, make_repo):
    return serve(model_name="hp", model_base_path=str(make_repo("hp", {1: "hp2_tf2"})))


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# ------------------------------------------------------------------------------------------------- classify
@pytest.mark.parametrize("model", ["tf1", "tf2"])
def test_classify_scores_only(request, model):
    server = request.getfixturevalue(model)
    r = post(server, "/v1/models/hp:classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.text == '{"results":[[["",3.0]]]}'


def test_classify_several_examples(tf1):
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}, {"x": [4.0]}, {"x": -1.0}]}
    r = post(tf1, "/v1/models/hp:classify", body)
    assert r.json() == {"results": [[["", 3.0]], [["", 4.0]], [["", 1.5]]]}


def test_classify_with_classes_and_scores(tf1):
    body = {"signature_name": "classify_with_classes", "examples": [{"x": 2.0}, {"x": -4.0}]}
    r = post(tf1, "/v1/models/hp:classify", body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2
    for row, x in zip(results, (2.0, -4.0), strict=True):
        (low_label, low), (high_label, high) = row
        assert (low_label, high_label) == ("low", "high")
        y = 0.5 * x + 2.0
        assert high == pytest.approx(sigmoid(y), rel=1e-6)
        assert low == pytest.approx(1.0 - sigmoid(y), rel=1e-6)
    # y = 0 for x = -4: exactly one half each.
    assert results[1] == [["low", 0.5], ["high", 0.5]]


# -------------------------------------------------------------------------------------------------- regress
@pytest.mark.parametrize("model", ["tf1", "tf2"])
def test_regress(request, model):
    server = request.getfixturevalue(model)
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}, {"x": 4.0}]}
    r = post(server, "/v1/models/hp:regress", body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.text == '{"results":[3.0,4.0]}'


def test_regress_second_output_signature(tf1):
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "regress_x_to_y2", "examples": [{"x": 2.0}, {"x": 0.2}]})
    assert r.json() == {"results": [4.0, 3.1]}


def test_context_supplies_a_feature_missing_from_examples(tf1):
    body = {"signature_name": "regress_x_to_y", "context": {"x": 2.0}, "examples": [{}, {}]}
    r = post(tf1, "/v1/models/hp:regress", body)
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [3.0, 3.0]}


def test_example_feature_overrides_context(tf1):
    body = {"signature_name": "regress_x_to_y", "context": {"x": 2.0, "note": "ctx"}, "examples": [{"x": 4.0}, {}]}
    r = post(tf1, "/v1/models/hp:regress", body)
    assert r.json() == {"results": [4.0, 3.0]}


def test_context_with_classify(tf2):
    body = {"signature_name": "classify_x_to_y", "context": {"x": [6.0]}, "examples": [{"extra": 1}]}
    r = post(tf2, "/v1/models/hp:classify", body)
    assert r.json() == {"results": [[["", 5.0]]]}


def test_extra_features_of_any_type_are_ignored_by_the_model(tf1):
    example = {"x": 2.0, "name": "a", "raw": {"b64": "AP8="}, "count": [1, 2], "flag": True}
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "regress_x_to_y", "examples": [example]})
    assert r.json() == {"results": [3.0]}


def test_version_and_label_paths(serve, make_repo, tmp_path):
    base = make_repo("hp", {1: "hp2_tf1", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    config.write_text(
        "model_config_list { config {\n"
        f'  name: "hp" base_path: "{base}" model_platform: "tensorflow"\n'
        "  model_version_policy { all {} }\n"
        '  version_labels { key: "stable" value: 1 }\n'
        '  version_labels { key: "canary" value: 2 }\n'
        "} }\n"
    )
    server = serve(model_config_file=str(config))
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}
    expected = {
        "/v1/models/hp:regress": 4.0,  # latest = version 2 (offset 3)
        "/v1/models/hp/versions/1:regress": 3.0,
        "/v1/models/hp/versions/2:regress": 4.0,
        "/v1/models/hp/labels/stable:regress": 3.0,
        "/v1/models/hp/labels/canary:regress": 4.0,
    }
    for path, value in expected.items():
        r = post(server, path, body)
        assert r.json() == {"results": [value]}, path
        # The version that answered, in headers (a workbench addition): value 3.0 is version 1's, 4.0 version 2's.
        assert (r.headers["X-Model-Name"], r.headers["X-Model-Version"]) == ("hp", "1" if value == 3.0 else "2")
    classify = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}
    r = post(server, "/v1/models/hp/labels/stable:classify", classify)
    assert r.json() == {"results": [[["", 3.0]]]}
    assert (r.headers["X-Model-Name"], r.headers["X-Model-Version"]) == ("hp", "1")
    r = post(server, "/v1/models/hp/versions/2:classify", classify)
    assert r.json() == {"results": [[["", 4.0]]]}
    assert (r.headers["X-Model-Name"], r.headers["X-Model-Version"]) == ("hp", "2")

    r = post(server, "/v1/models/hp/versions/3:regress", body)
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Specific(hp, 3)"}
    r = post(server, "/v1/models/hp/labels/nope:classify", classify)
    assert r.status_code == 400
    assert r.json() == {"error": "Unrecognized servable version label: nope"}


# -------------------------------------------------------------------------------- tf.Example from the JSON
def features_of(body: dict) -> list[dict]:
    """The JSON request as the tf.Examples the model receives (context merged), as {name: (kind, values)}."""
    import tensorflow as tf

    _, request_input = input_from_json(json.dumps(body).encode())
    decoded = []
    for serialized in serialized_examples(request_input):
        example = tf.train.Example.FromString(serialized)
        decoded.append(
            {
                name: (feature.WhichOneof("kind"), list(getattr(feature, feature.WhichOneof("kind")).value))
                for name, feature in example.features.feature.items()
            }
        )
    return decoded


def test_json_token_decides_the_feature_type():
    body = {"examples": [{"i": 2, "f": 2.0, "s": "héllo", "b": {"b64": "AP8="}, "t": True, "l": [1, 2, 3]}]}
    assert features_of(body) == [
        {
            "i": ("int64_list", [2]),
            "f": ("float_list", [2.0]),
            "s": ("bytes_list", ["héllo".encode()]),
            "b": ("bytes_list", [b"\x00\xff"]),
            "t": ("int64_list", [1]),
            "l": ("int64_list", [1, 2, 3]),
        }
    ]


def test_context_merge_in_the_serialized_examples():
    body = {"context": {"x": 1.0, "c": "ctx"}, "examples": [{"x": 5.0}, {"y": [7, 8]}]}
    assert features_of(body) == [
        {"x": ("float_list", [5.0]), "c": ("bytes_list", [b"ctx"])},
        {"x": ("float_list", [1.0]), "c": ("bytes_list", [b"ctx"]), "y": ("int64_list", [7, 8])},
    ]


def test_int_and_string_features_reach_the_model_with_their_type(tf1):
    # The model parses x as float; an int64 or bytes feature is the graph's own type error, as in TF Serving.
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 2}]})
    assert r.status_code == 400
    assert "Data type: int64 but expected type: float" in r.json()["error"]
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": {"b64": "AAA="}}]})
    assert r.status_code == 400
    assert "Data type: string but expected type: float" in r.json()["error"]


# ---------------------------------------------------------------------------------------------------- errors
LONG_ERRORS = [
    # (body, exact message or substring)
    ({"signature_name": "regress_x_to_y"}, "When method is classify, key 'examples' is expected and was not found"),
    ({"examples": {"x": 1.0}}, "Expecting 'examples' value to be an list/array"),
    ({"examples": []}, "'examples' value is an empty array"),
]


@pytest.mark.parametrize("verb", ["classify", "regress"])
@pytest.mark.parametrize(("body", "message"), LONG_ERRORS, ids=["no-examples", "not-a-list", "empty"])
def test_request_shape_errors(tf1, verb, body, message):
    r = post(tf1, f"/v1/models/hp:{verb}", body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error.startswith("JSON Value: {")
    assert message in error


EXAMPLE_ERRORS = [
    ({"examples": [3]}, "Example must be JSON object but got JSON Number"),
    ({"examples": [[{"x": 1.0}]]}, "Example must be JSON object but got JSON Array"),
    ({"context": "c", "examples": [{"x": 1.0}]}, "Example must be JSON object but got JSON String"),
    ({"examples": [{"x": [1, 2.5]}]}, "Unexpected element type in feature: x expecting type: int64"),
    ({"examples": [{"x": [2.5, 1]}]}, "Unexpected element type in feature: x expecting type: float"),
    ({"examples": [{"x": ["a", 1.0]}]}, "Unexpected element type in feature: x expecting type: bytes"),
    ({"examples": [{"x": [{"b64": "AA=="}, True]}]}, "Unexpected element type in feature: x expecting type: bytes"),
    ({"examples": [{"x": [None]}]}, "Feature: x has element with unexpected JSON type: Null"),
    ({"examples": [{"x": None}]}, "Feature: x has element with unexpected JSON type: Null"),
    ({"examples": [{"x": [[1.0]]}]}, "Feature: x has element with unexpected JSON type: Array"),
    ({"examples": [{"x": {"a": 1}}]}, "Feature: x has element with unexpected JSON type: Object"),
    ({"examples": [{"x": 2**63}]}, "Feature: x has uint64 element. Only int64 is supported."),
    ({"examples": [{"x": {"b64": "!!"}}]}, "Unable to base64 decode"),
]


@pytest.mark.parametrize(
    ("body", "message"),
    EXAMPLE_ERRORS,
    ids=[
        "number-example",
        "list-example",
        "string-context",
        "int-then-float",
        "float-then-int",
        "string-then-float",
        "b64-then-bool",
        "null-in-list",
        "null",
        "nested-list",
        "object",
        "uint64",
        "bad-b64",
    ],
)
def test_example_errors(tf1, body, message):
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "regress_x_to_y", **body})
    assert r.status_code == 400, r.text
    assert r.json() == {"error": message}


def test_lossy_float_feature(tf1):
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": [1.0, 1e39]}]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error.startswith("Cannot convert JSON value: ")
    assert error.endswith(" to float without loss of precision.")


def test_mixed_feature_types_message_is_exact(tf1):
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": [1, 2.5]}]}
    r = post(tf1, "/v1/models/hp:classify", body)
    assert r.status_code == 400
    assert r.json() == {"error": "Unexpected element type in feature: x expecting type: int64"}


def test_unparseable_example_json_function_errors():
    with pytest.raises(ServingError, match="JSON Parse error"):
        input_from_json(b"{examples")
    with pytest.raises(ServingError, match="Is not object"):
        input_from_json(b"[]")


@pytest.mark.parametrize("verb", ["classify", "regress"])
def test_unknown_signature(tf1, verb):
    r = post(tf1, f"/v1/models/hp:{verb}", {"signature_name": "nope", "examples": [{"x": 1.0}]})
    assert r.status_code == 400
    assert r.json() == {"error": "No signature was found with the name: nope"}


# TF Serving checks a signature's method_name only with --enable_signature_method_name_check (off by default):
# a signature is refused for what it lacks (the outputs), and the message says which method it has.
def test_classify_on_a_regression_signature(tf1):
    r = post(tf1, "/v1/models/hp:classify", {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]})
    assert r.status_code == 400
    assert r.json() == {
        "error": 'Expected classification signature outputs to contain at least one of "classes" or "scores". '
        "Found: outputs (signature regress_x_to_y, method tensorflow/serving/regress)"
    }


def test_regress_on_a_classification_signature(tf1):
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "classify_x_to_y", "examples": [{"x": 1.0}]})
    assert r.status_code == 400
    assert r.json() == {
        "error": 'No regression outputs found: expected "outputs". '
        "Found: scores (signature classify_x_to_y, method tensorflow/serving/classify)"
    }


def test_regress_on_a_signature_whose_input_tensor_is_float(tf1):
    # The input names a float tensor (x2:0), so serialized examples cannot be fed: the error names the input.
    r = post(tf1, "/v1/models/hp:regress", {"signature_name": "regress_x2_to_y3", "examples": [{"x2": 1.0}]})
    assert r.status_code == 400
    assert r.json() == {
        "error": 'Input "inputs" expects float [-1,1] but received 1 serialized tf.Example(s): signature '
        "regress_x2_to_y3 does not read tf.Examples; send its input to :predict"
    }


@pytest.mark.parametrize("verb", ["classify", "regress"])
def test_default_signature_is_serving_default_and_predict_only(tf2, verb):
    # serving_default takes a float tensor, not serialized examples.
    r = post(tf2, f"/v1/models/hp:{verb}", {"examples": [{"x": 1.0}]})
    assert r.status_code == 400
    assert "serving_default" in r.json()["error"]


def test_tf2_signature_without_expected_outputs(tf2):
    r = post(tf2, "/v1/models/hp:classify", {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]})
    assert r.status_code == 400
    assert 'at least one of "classes" or "scores"' in r.json()["error"]
    r = post(tf2, "/v1/models/hp:regress", {"signature_name": "classify_x_to_y", "examples": [{"x": 1.0}]})
    assert r.status_code == 400
    assert '"outputs"' in r.json()["error"]


@pytest.mark.parametrize("verb", ["classify", "regress"])
def test_unknown_model(tf1, verb):
    r = post(tf1, f"/v1/models/nope:{verb}", {"examples": [{"x": 1.0}]})
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "Servable not found for request: Latest(nope)"}


def test_bad_json_body(tf1):
    r = post(tf1, "/v1/models/hp:classify", b"{not json")
    assert r.status_code == 400
    assert r.json()["error"].startswith("JSON Parse error")


def test_get_on_classify_is_malformed(tf1):
    r = requests.get(tf1.rest_url + "/v1/models/hp:classify", timeout=10)
    assert r.status_code == 400
    assert r.json() == {"error": "Malformed request: GET /v1/models/hp:classify"}


# ---------------------------------------------- a TF1 signature that declares its string input DT_FLOAT (issue 13)
REGRESS = "tensorflow/serving/regress"
CLASSIFY = "tensorflow/serving/classify"


@pytest.fixture(scope="module")
def declared_float(tmp_path_factory):
    """A server of a model like TF Serving's saved_model_half_plus_three (y = 0.5 * x + 3), REST and gRPC."""
    from workbench.config.options import ServerOptions
    from workbench.server import ServerThread

    base = tmp_path_factory.mktemp("declared_float") / "half_plus_three"
    models.save_tf1_regress_declared_float(base / "123")
    options = ServerOptions(rest_api_port=-1, port=0, model_name="half_plus_three", model_base_path=str(base))
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def declared_float_stub(declared_float):
    with grpc.insecure_channel(declared_float.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def x_examples(*values: float) -> list[tf.train.Example]:
    return [
        tf.train.Example(
            features=tf.train.Features(feature={"x": tf.train.Feature(float_list=tf.train.FloatList(value=[v]))})
        )
        for v in values
    ]


def test_declared_float_regress_over_rest_is_served_as_tf_serving_serves_it(declared_float):
    body = {"signature_name": REGRESS, "examples": [{"x": 1.0}, {"x": 2.0}]}
    r = post(declared_float, "/v1/models/half_plus_three:regress", body)
    assert r.status_code == 200, r.text
    assert r.text == '{"results":[3.5,4.0]}'
    assert (r.headers["X-Model-Name"], r.headers["X-Model-Version"]) == ("half_plus_three", "123")


def test_declared_float_classify_over_rest(declared_float):
    body = {"signature_name": CLASSIFY, "examples": [{"x": 1.0}, {"x": 2.0}]}
    r = post(declared_float, "/v1/models/half_plus_three:classify", body)
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [[["", 3.5]], [["", 4.0]]]}


def test_declared_float_metadata_still_reports_the_signature_as_written(declared_float):
    # TF Serving reports the SignatureDef as the model wrote it; only feeding goes by the graph's tensor type.
    r = requests.get(declared_float.rest_url + "/v1/models/half_plus_three/metadata", timeout=30)
    signature = r.json()["metadata"]["signature_def"]["signature_def"][REGRESS]
    assert signature["inputs"]["inputs"]["dtype"] == "DT_FLOAT"
    assert signature["inputs"]["inputs"]["name"] == "tf_example:0"


def test_declared_float_regress_classify_and_multi_inference_over_grpc(declared_float_stub):
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "half_plus_three"
    request.model_spec.signature_name = REGRESS
    request.input.example_list.examples.extend(x_examples(1.0, 2.0))
    response = declared_float_stub.Regress(request, 30.0)
    assert [r.value for r in response.result.regressions] == [3.5, 4.0]
    assert (response.model_spec.version.value, response.model_spec.signature_name) == (123, REGRESS)

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "half_plus_three"
    request.model_spec.signature_name = CLASSIFY
    request.input.example_list.examples.extend(x_examples(1.0, 2.0))
    response = declared_float_stub.Classify(request, 30.0)
    assert [[c.score for c in row.classes] for row in response.result.classifications] == [[3.5], [4.0]]

    request = inference_pb2.MultiInferenceRequest()
    for signature, method in ((REGRESS, REGRESS), (CLASSIFY, CLASSIFY)):
        task = request.tasks.add(method_name=method)
        task.model_spec.name = "half_plus_three"
        task.model_spec.signature_name = signature
    request.input.example_list.examples.extend(x_examples(4.0))
    response = declared_float_stub.MultiInference(request, 30.0)
    assert response.results[0].regression_result.regressions[0].value == 5.0
    assert response.results[1].classification_result.classifications[0].classes[0].score == 5.0
