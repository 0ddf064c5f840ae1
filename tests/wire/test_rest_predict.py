"""The REST predict API against real TF1 and TF2 SavedModels: formats, types, and every error TF Serving gives."""

from __future__ import annotations

import base64
import json

import models  # (tests/models.py)
import pytest
import requests


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_store):
    import shutil

    from workbench.config.options import ServerOptions
    from workbench.server import ServerThread

    root = tmp_path_factory.mktemp("predict")
    for name, stored in [("tf1", "hp2_tf1"), ("tf2", "hp2_tf2"), ("multi", "multi_io")]:
        shutil.copytree(model_store / stored, root / name / "1")
    models.save_dense(root / "dense" / "1")
    config = root / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{ name: "{n}" base_path: "{root / n}" model_platform: "tensorflow" }}\n'
            for n in ("tf1", "tf2", "multi", "dense")
        )
        + "}\n"
    )
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_config_file=str(config))) as running:
        yield running


def post(server, path: str, body) -> requests.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(server.rest_url + path, data=data, timeout=30)


@pytest.mark.parametrize("model", ["tf1", "tf2"])
def test_row_format_answers_like_tf_serving(server, model):
    r = post(server, f"/v1/models/{model}:predict", {"instances": [[2.0], [3.0], [4.0]]})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.text == '{"predictions":[[3.0],[3.5],[4.0]]}'


def test_tf1_accepts_rank_one_instances_like_tf_serving(server):
    # TF Serving feeds tensors without checking them against the signature's shape [-1, 1].
    r = post(server, "/v1/models/tf1:predict", {"instances": [2.0, 3.0, 4.0]})
    assert r.json() == {"predictions": [3.0, 3.5, 4.0]}


@pytest.mark.parametrize("body", [{"inputs": [[1.0], [2.0]]}, {"inputs": {"x": [[1.0], [2.0]]}}])
def test_columnar_format(server, body):
    r = post(server, "/v1/models/tf2:predict", body)
    assert r.status_code == 200
    assert r.json() == {"outputs": [[2.5], [3.0]]}


def test_named_signature_and_version_path(server):
    r = post(server, "/v1/models/tf1/versions/1:predict", {"signature_name": "serving_default", "instances": [[1.0]]})
    assert r.json() == {"predictions": [[2.5]]}


def test_nan_and_infinity_tokens_round_trip(server):
    r = post(server, "/v1/models/tf2:predict", b'{"instances": [[NaN], [Infinity], [-Infinity], [0.1]]}')
    assert r.status_code == 200
    assert r.text == '{"predictions":[[NaN],[Infinity],[-Infinity],[2.05]]}'


def test_floats_print_shortest_round_trip(server):
    r = post(server, "/v1/models/tf2:predict", {"instances": [[0.2], [1e-7]]})
    # float32 results printed as the shortest decimal that round-trips, whole numbers with ".0".
    assert r.text == '{"predictions":[[2.1],[2.0]]}'


def test_multiple_inputs_and_outputs_row_format(server):
    body = {"instances": [{"a": [1.0, 2.0], "b": 3, "text": "hi"}, {"a": [0.5, 0.5], "b": -1, "text": {"b64": "AP8="}}]}
    r = post(server, "/v1/models/multi:predict", body)
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    assert predictions[0] == {"total": 6.0, "doubled": 6, "upper": "HI", "echo_bytes": {"b64": "aGk="}}
    assert predictions[1]["total"] == 0.0 and predictions[1]["doubled"] == -2
    assert base64.b64decode(predictions[1]["echo_bytes"]["b64"]) == b"\x00\xff"
    # Bytes that are not UTF-8 in an output not named *_bytes still come back losslessly, as b64.
    assert predictions[1]["upper"] == {"b64": "AP8="}


def test_multiple_inputs_columnar(server):
    body = {"inputs": {"a": [[1.0, 1.0]], "b": [2], "text": ["x"]}}
    r = post(server, "/v1/models/multi:predict", body)
    assert r.json() == {"outputs": {"total": [4.0], "doubled": [4], "upper": ["X"], "echo_bytes": [{"b64": "eA=="}]}}


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        (
            "/v1/models/tf2:predict",
            {"instances": [[1.0]], "inputs": [[1.0]]},
            400,
            "expecting only one of 'inputs' or 'instances'",
        ),
        ("/v1/models/tf2:predict", {"signature_name": "serving_default"}, 400, "Missing 'inputs' or 'instances' key"),
        ("/v1/models/tf2:predict", {"instances": []}, 400, "No values in 'instances' array"),
        ("/v1/models/tf2:predict", {"instances": {"x": 1}}, 400, "Excepting 'instances' to be an list/array"),
        (
            "/v1/models/tf2:predict",
            {"signature_name": "nope", "instances": [[1.0]]},
            400,
            'Serving signature name: "nope" not found in signature def',
        ),
        (
            "/v1/models/tf2:predict",
            {"signature_name": 3, "instances": [[1.0]]},
            400,
            "'signature_name' key must be a string",
        ),
        ("/v1/models/tf2:predict", {"instances": [["a"]]}, 400, "is not of expected type: float"),
        ("/v1/models/tf2:predict", {"instances": [[1.0], [1.0, 2.0]]}, 400, "Failed to process element: 1"),
        ("/v1/models/tf2:predict", {"inputs": [[1.0], [1.0, 2.0]]}, 400, "Encountered list at unexpected size: 2"),
        ("/v1/models/tf2:predict", {"inputs": [[1e39]]}, 400, "without loss of precision"),
        ("/v1/models/tf2:predict", {"inputs": [[16777217]]}, 400, "without loss of precision"),
        ("/v1/models/tf2:predict", b"{not json", 400, "JSON Parse error"),
        ("/v1/models/tf2:predict", b"", 400, "JSON Parse error: The document is empty"),
        ("/v1/models/tf2:predict", b"[1, 2]", 400, "Is not object"),
        ("/v1/models/tf2:predict", b"[" * 100000, 400, "JSON Parse error"),
        ("/v1/models/multi:predict", {"instances": [[1.0, 2.0]]}, 400, "expecting list of objects"),
        ("/v1/models/multi:predict", {"inputs": [[1.0, 2.0]]}, 400, "expecting an object"),
        ("/v1/models/multi:predict", {"inputs": {"a": [[1.0, 2.0]], "b": [1]}}, 400, "Missing named input: text"),
        (
            "/v1/models/multi:predict",
            {"instances": [{"a": [1.0, 2.0], "b": 1}]},
            400,
            "keys must be equal to: a,b,text",
        ),
        (
            "/v1/models/multi:predict",
            {"instances": [{"a": [1.0, 2.0], "b": 1.5, "text": "x"}]},
            400,
            "is not of expected type: int64",
        ),
        (
            "/v1/models/multi:predict",
            {"inputs": {"a": [[1.0, 2.0]], "b": [1], "text": [{"b64": "!!"}]}},
            400,
            "Unable to base64 decode",
        ),
        # Shapes are checked by the graph's own ops, as in TF Serving: [2] + [3] cannot broadcast.
        (
            "/v1/models/multi:predict",
            {"inputs": {"a": [[1, 2], [3, 4]], "b": [1, 2, 3], "text": ["x"]}},
            400,
            "Incompatible shapes",
        ),
        ("/v1/models/nope:predict", {"instances": [1.0]}, 404, "Servable not found for request: Latest(nope)"),
        (
            "/v1/models/tf2/versions/50:predict",
            {"instances": [1.0]},
            404,
            "Servable not found for request: Specific(tf2, 50)",
        ),
        (
            "/v1/models/tf2/labels/canary:predict",
            {"instances": [1.0]},
            400,
            "Unrecognized servable version label: canary",
        ),
        ("/v1/models/tf2/versions/1/labels/x:predict", {"instances": [1.0]}, 400, "Malformed request: POST"),
        ("/v1/models/tf2/versions/one:predict", {"instances": [1.0]}, 400, "Malformed request: POST"),
        ("/v1/models/tf2:train", {"instances": [1.0]}, 400, "Malformed request: POST"),  # :explain is served
    ],
)
def test_errors_are_json_with_tf_serving_messages(server, path, body, status, message):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"]


def test_get_on_a_predict_path_is_malformed(server):
    r = requests.get(server.rest_url + "/v1/models/tf2:predict", timeout=10)
    assert r.status_code == 400
    assert r.json() == {"error": "Malformed request: GET /v1/models/tf2:predict"}


# ------------------------------------------------------------------------ errors name the input (issue 13)
MULTI_INPUTS = "Signature inputs: a float [-1,2], b int64 [-1], text string [-1]."


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        # A row of the wrong width decodes; TensorFlow refuses it, and the error says which input and why.
        (
            "/v1/models/dense:predict",
            {"instances": [[1.0, 2.0, 3.0]]},
            'Input "features" expects float [-1,4] but received float [1,3]: Matrix size-incompatible: '
            "In[0]: [1,3], In[1]: [4,2]",
        ),
        (
            "/v1/models/dense:predict",
            {"inputs": [1.0, 2.0, 3.0, 4.0]},
            'Input "features" expects float [-1,4] but received float [4]: In[0] ',  # TensorFlow's words follow
        ),
        (
            "/v1/models/dense:predict",
            {"inputs": [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0]]},
            'Input "features" expects float [-1,4] but received a ragged list (lists of 4 and of 3 at depth 1): '
            "Encountered list at unexpected size: 3 at level: 1 expected size: 4",
        ),
        (
            "/v1/models/dense:predict",
            {"instances": [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0]]},
            'Input "features" expects float [-1,4] but received instances of different shapes ([4] in instance 0, '
            "[3] in instance 1): Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
            "Expecting tensor size: 4 but got: 3",
        ),
        (
            "/v1/models/dense:predict",
            {"instances": [[1.0, 2.0, "3", 4.0]]},
            'Input "features" expects float [-1,4] but received a JSON String in instance 0: Failed to process '
            """element: 0 of 'instances' list. Error: INVALID_ARGUMENT: JSON Value: "3" Type: String is not of """
            "expected type: float",
        ),
        (
            "/v1/models/multi:predict",
            {"instances": [{"a": [1.0, 2.0], "b": 1.5, "text": "x"}]},
            'Input "b" expects int64 [-1] but received the JSON float 1.5 in instance 0: Failed to process element: '
            "0 key: b of 'instances' list. Error: INVALID_ARGUMENT: JSON Value: 1.5 Type: Number is not of expected "
            "type: int64",
        ),
        (
            "/v1/models/multi:predict",
            {"inputs": {"a": [[1.0, 2.0]], "b": [1], "text": [{"b64": "!!"}]}},
            'Input "text" expects string [-1] but received invalid base64: Unable to base64 decode',
        ),
        (
            "/v1/models/multi:predict",
            {"inputs": {"a": [[{"b64": "AAA="}, 1.0]], "b": [1], "text": ["x"]}},
            'Input "a" expects float [-1,2] but received a JSON Object: JSON Value: {"b64":"AAA="} Type: Object is '
            "not of expected type: float",
        ),
        (
            "/v1/models/multi:predict",
            {"inputs": {"a": [[1.0, 2.0]], "b": [1]}},
            f"Missing named input: text in 'inputs' object. {MULTI_INPUTS}",
        ),
        (
            "/v1/models/multi:predict",
            {"instances": [{"a": [1.0, 2.0], "b": 1, "text": "x", "extra": 0}]},
            "Failed to process element: 0 key: extra of 'instances' list. Error: INVALID_ARGUMENT: JSON object: does "
            f"not have named input: extra. {MULTI_INPUTS}",
        ),
    ],
    ids=[
        "row-too-narrow",
        "rank-1",
        "columnar-ragged",
        "row-ragged",
        "row-string",
        "float-for-int64",
        "bad-b64",
        "b64-for-float",
        "missing",
        "extra",
    ],
)
def test_input_errors_name_the_input_what_it_expects_and_what_came(server, path, body, message):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"].startswith(message)  # TensorFlow's errors go on with the node that failed


def test_a_graph_error_with_every_input_as_declared_is_tensorflows_own(server):
    # [2,2] and [3] fit their declared [-1,2] and [-1]; only the graph's broadcast fails, so no input is blamed.
    r = post(server, "/v1/models/multi:predict", {"inputs": {"a": [[1, 2], [3, 4]], "b": [1, 2, 3], "text": ["x"]}})
    assert r.status_code == 400
    assert r.json()["error"].startswith("Incompatible shapes")


def test_the_right_width_still_serves(server):
    r = post(server, "/v1/models/dense:predict", {"instances": [[1.0, 2.0, 3.0, 4.0]]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [[10.0, 20.0]]}


# ------------------------------------------------------------------- which version answered (issue 13)
def test_answers_name_the_model_and_version_in_headers(server):
    r = post(server, "/v1/models/tf2:predict", {"instances": [[1.0]]})
    assert r.status_code == 200
    assert (r.headers["X-Model-Name"], r.headers["X-Model-Version"]) == ("tf2", "1")
    r = post(server, "/v1/models/tf1/versions/1:predict", {"inputs": [[1.0]]})
    assert (r.headers["X-Model-Name"], r.headers["X-Model-Version"]) == ("tf1", "1")


def test_errors_carry_no_version_headers(server):
    for path in ("/v1/models/nope:predict", "/v1/models/dense:predict"):
        r = post(server, path, {"instances": [[1.0]]})
        assert r.status_code in (400, 404)
        assert "X-Model-Name" not in r.headers and "X-Model-Version" not in r.headers


def test_the_version_header_is_the_version_that_answered_labels_and_canary(serve, make_repo, tmp_path):
    # v1 answers 0.5 * 2 + 2 = 3.0 and v2 0.5 * 2 + 3 = 4.0, so each answer says which version computed it.
    base = make_repo("hp", {1: "hp2_tf1", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "hp" base_path: "{base}" model_platform: "tensorflow" '
        "model_version_policy { all {} } } }\n"
    )
    server = serve(model_config_file=str(config))
    computed_by = {3.0: "1", 4.0: "2"}

    def answer(path: str) -> tuple[str, str]:
        r = post(server, path, {"instances": [2.0]})
        assert r.status_code == 200, r.text
        assert r.headers["X-Model-Name"] == "hp"
        return computed_by[r.json()["predictions"][0]], r.headers["X-Model-Version"]

    def manage(action: str, body: dict) -> None:
        r = requests.post(f"{server.rest_url}/workbench/v1/models/hp:{action}", json=body, timeout=60)
        assert r.status_code == 200, r.text

    assert answer("/v1/models/hp:predict") == ("2", "2")  # TF Serving's default: the latest
    manage("promote", {"version": 1})
    manage("canary", {"version": 2, "weight": 0.5})
    assert answer("/v1/models/hp/labels/stable:predict") == ("1", "1")
    assert answer("/v1/models/hp/labels/canary:predict") == ("2", "2")
    # Default traffic is split between the stable version and the canary: the header follows each request.
    answers = [answer("/v1/models/hp:predict") for _ in range(10)]
    assert all(computed == header for computed, header in answers), answers
    assert {header for _, header in answers} == {"1", "2"}
