"""Folders laid out for MLServer served unchanged: the requests of MLServer's sklearn, xgboost, lightgbm, mms and
model-repository examples (their READMEs) answered as MLServer answers them, over REST with ``requests`` and over gRPC
with ``tritonclient``; its content types, its casting and its refusals; the repository extension on the layout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException
from waiting import wait_until

from tests.mlserver_folders import (
    catboost_example,
    digits,
    iris_lightgbm,
    lightgbm_example,
    mms_example,
    mnist_svm,
    mushroom_xgboost,
    mushrooms,
    random_catboost,
    sklearn_example,
    write_json,
    xgboost_example,
)
from workbench.config.options import ServerOptions
from workbench.models.configs import discover_models
from workbench.server import ServerThread


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    """The sklearn, xgboost and lightgbm examples' folders, side by side under one root (with folders that are not
    models: an mlruns/ and a tests/, as a project holds)."""
    root = tmp_path_factory.mktemp("examples")
    sklearn_example(root / "sklearn") if (root / "sklearn").mkdir() is None else None
    xgboost_example(root / "xgboost")
    lightgbm_example(root / "lightgbm")
    (root / "mlruns" / "0").mkdir(parents=True)
    (root / "tests").mkdir()
    return root


@pytest.fixture(scope="module")
def server(examples) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(examples), allow_pickle=True)
    with ServerThread(options) as running:
        yield running


def infer(server: ServerThread, path: str, body: dict) -> requests.Response:
    return requests.post(f"{server.rest_url}/v2/models/{path}/infer", json=body, timeout=60)


def one_input(x: np.ndarray, name: str = "predict", datatype: str = "FP32") -> dict:
    """The READMEs' request: one input named as the example names it, FP32, the row's shape."""
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.tolist()}]}


# ================================================================================================ discovery
def test_the_layout_is_discovered_with_versions_as_labels(examples):
    models = {m.name: m for m in discover_models(examples)}
    assert set(models) == {"mnist-svm", "mushroom-xgboost", "iris-lgb"}  # not mlruns, tests, sklearn, xgboost...
    assert all(m.labels == {"v0.1.0": 1} for m in models.values())


def test_a_model_without_a_name_takes_its_folder_name(tmp_path):
    mushroom_xgboost().save_model(tmp_path / "shrooms" / "model.json") if (tmp_path / "shrooms").mkdir() is None else 0
    write_json(tmp_path / "shrooms" / "model-settings.json", {"implementation": "mlserver_xgboost.XGBoostModel"})
    (model,) = discover_models(tmp_path)
    assert model.name == "shrooms" and model.labels == {}


def test_versions_of_one_model_are_numbered_in_version_order(tmp_path):
    for version in ["v0.10.0", "v0.2.0"]:
        folder = tmp_path / "models" / "m" / version
        folder.mkdir(parents=True)
        mushroom_xgboost().save_model(folder / "model.json")
        write_json(
            folder / "model-settings.json",
            {"name": "m", "implementation": "mlserver_xgboost.XGBoostModel", "parameters": {"version": version}},
        )
    (model,) = discover_models(tmp_path)
    assert model.labels == {"v0.2.0": 1, "v0.10.0": 2}


# ================================================================================================ the examples
def test_sklearn_example(server):
    _, _, x_test, y_test = digits()
    response = infer(server, "mnist-svm/versions/v0.1.0", one_input(x_test[0:1]))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_name"] == "mnist-svm" and body["model_version"] == "v0.1.0"
    (output,) = body["outputs"]
    expected = mnist_svm().predict(x_test[0:1])
    assert output == {
        "name": "predict",
        "datatype": "INT64",
        "shape": [1, 1],
        "parameters": {"content_type": "np"},
        "data": expected.tolist(),
    }
    assert output["data"] == [y_test[0]]


def test_xgboost_example_answers_the_boosters_probabilities(server):
    """MLServer loads a booster as an XGBRegressor: predict is binary:logistic's probability, FP32 [N, 1]."""
    rows, _ = mushrooms()
    response = infer(server, "mushroom-xgboost/versions/v0.1.0", one_input(rows[0:3]))
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "predict" and output["datatype"] == "FP32" and output["shape"] == [3, 1]
    import xgboost as xgb

    expected = mushroom_xgboost().predict(xgb.DMatrix(rows[0:3].astype(np.float32)))
    np.testing.assert_allclose(output["data"], expected, rtol=1e-6)
    assert output["parameters"] == {"content_type": "np"}


def test_xgboost_predict_proba(server):
    rows, _ = mushrooms()
    body = {**one_input(rows[0:2]), "outputs": [{"name": "predict"}, {"name": "predict_proba"}]}
    outputs = {o["name"]: o for o in infer(server, "mushroom-xgboost", body).json()["outputs"]}
    assert outputs["predict_proba"]["shape"] == [2, 2]
    proba = np.array(outputs["predict_proba"]["data"]).reshape(2, 2)
    np.testing.assert_allclose(proba[:, 1], outputs["predict"]["data"], rtol=1e-6)


def test_lightgbm_example(server):
    from sklearn.datasets import load_iris

    x = load_iris()["data"][0:1]
    response = infer(server, "iris-lgb/versions/v0.1.0", one_input(x, name="predict-prob"))
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "predict" and output["datatype"] == "FP64" and output["shape"] == [1, 3]
    np.testing.assert_allclose(output["data"], iris_lightgbm().predict(x.astype(np.float32)).reshape(-1))


def test_catboost_example_answers_the_classes(tmp_path):
    pytest.importorskip("catboost")  # the catboost extra
    catboost_example(tmp_path)
    model, rows = random_catboost()
    x = rows[0:3]
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path))
    with ServerThread(options) as running:
        response = infer(running, "catboost/versions/v0.1.0", one_input(x[0:1], name="predict-prob"))
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        assert output["name"] == "predict" and output["datatype"] == "INT64" and output["shape"] == [1, 1]
        assert output["data"] == model.predict(x[0:1]).tolist()
        asked = {**one_input(x, name="predict-prob"), "outputs": [{"name": "predict_proba"}]}
        response = infer(running, "catboost", asked)  # CatboostModel answers predict whatever is asked
        assert response.status_code == 200, response.text
        assert response.json()["model_version"] == "v0.1.0"
        (output,) = response.json()["outputs"]
        assert output["name"] == "predict" and output["data"] == model.predict(x).tolist()


def test_metadata_names_the_version_string(server):
    metadata = requests.get(f"{server.rest_url}/v2/models/mnist-svm/versions/v0.1.0", timeout=30).json()
    assert metadata["name"] == "mnist-svm" and metadata["versions"] == ["v0.1.0"]


def test_mms_example(tmp_path):
    folder = mms_example(tmp_path)
    _, _, x_digits, _ = digits()
    rows, _ = mushrooms()
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(folder), allow_pickle=True)
    with ServerThread(options) as running:
        svm = infer(running, "mnist-svm/versions/v0.1.0", one_input(x_digits[0:1]))
        booster = infer(running, "mushroom-xgboost/versions/v0.1.0", one_input(rows[0:1]))
        assert svm.status_code == 200 and booster.status_code == 200, (svm.text, booster.text)
        assert svm.json()["outputs"][0]["data"] == mnist_svm().predict(x_digits[0:1]).tolist()
        # the model-repository example, on the same folder
        index = requests.post(f"{running.rest_url}/v2/repository/index", json={}, timeout=30).json()
        assert {(row["name"], row["state"]) for row in index} == {("mnist-svm", "READY"), ("mushroom-xgboost", "READY")}


# ================================================================================================ sklearn's outputs
def test_sklearn_outputs_asked_by_name(tmp_path):
    import joblib
    from sklearn.linear_model import LogisticRegression

    x_train, y_train, x_test, _ = digits()
    model = LogisticRegression(max_iter=200).fit(x_train, y_train)
    folder = tmp_path / "lr"
    folder.mkdir()
    joblib.dump(model, folder / "model.joblib")
    write_json(
        folder / "model-settings.json",
        {"implementation": "mlserver_sklearn.SKLearnModel", "parameters": {"extra": {"predict_fn": "predict_proba"}}},
    )
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_pickle=True)) as s:
        default = infer(s, "lr", one_input(x_test[0:2])).json()["outputs"]
        assert [o["name"] for o in default] == ["predict_proba"] and default[0]["shape"] == [2, 10]
        both = infer(s, "lr", {**one_input(x_test[0:2]), "outputs": [{"name": "predict"}, {"name": "predict_proba"}]})
        assert [o["name"] for o in both.json()["outputs"]] == ["predict", "predict_proba"]
        assert "model_version" not in both.json()  # no version string: none, as MLServer answers
        wrong = infer(s, "lr", {**one_input(x_test[0:2]), "outputs": [{"name": "decision_function"}]})
        assert wrong.status_code == 400
        assert wrong.json()["error"] == (
            "SKLearnModel only supports 'predict', 'predict_proba' and 'transform' as outputs "
            "(decision_function was received)"
        )


# ================================================================================================ inputs
def test_numbers_are_cast_to_the_models_type(server):
    _, _, x_test, _ = digits()
    as_int = infer(server, "mnist-svm", one_input(x_test[0:1].astype(np.int32), datatype="INT32"))
    as_double = infer(server, "mnist-svm", one_input(x_test[0:1], datatype="FP64"))
    assert as_int.status_code == as_double.status_code == 200
    assert as_int.json()["outputs"] == as_double.json()["outputs"]


def test_two_inputs_are_refused_as_mlservers_np_codec_refuses_them(server):
    _, _, x_test, _ = digits()
    body = one_input(x_test[0:1])
    body["inputs"].append({"name": "other", "shape": [1], "datatype": "FP32", "data": [1.0]})
    response = infer(server, "mnist-svm", body)
    assert response.status_code == 400
    assert response.json()["error"] == (
        "There was an error encoding / decoding the payload: The 'np' codec only supports a single input tensor "
        "(2 were received)"
    )


def test_pandas_content_type_makes_columns_of_the_inputs(server):
    """``pd``: every input a column of the one DataFrame, in the order sent."""
    from sklearn.datasets import load_iris

    x = load_iris()["data"][0:2]
    body = {
        "parameters": {"content_type": "pd"},
        "inputs": [
            {"name": f"f{i}", "shape": [2], "datatype": "FP64", "data": x[:, i].tolist()} for i in range(x.shape[1])
        ],
    }
    response = infer(server, "iris-lgb", body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["outputs"][0]["data"], iris_lightgbm().predict(x).reshape(-1))


def test_text_that_is_not_a_number_is_refused(server):
    body = {"inputs": [{"name": "predict", "shape": [1, 1], "datatype": "BYTES", "data": ["nope"]}]}
    response = infer(server, "mnist-svm", body)
    assert response.status_code == 400 and "not numbers" in response.json()["error"]


def test_a_row_of_the_wrong_width_is_a_400(server):
    response = infer(server, "mnist-svm", one_input(np.zeros((1, 3))))
    assert response.status_code == 400


def test_grpc_clients_get_the_same_answers(server):
    client = triton_grpc.InferenceServerClient(server.grpc_target)
    _, _, x_test, _ = digits()
    tensor = triton_grpc.InferInput("predict", list(x_test[0:1].shape), "FP32")
    tensor.set_data_from_numpy(x_test[0:1].astype(np.float32))
    result = client.infer("mnist-svm", [tensor], model_version="v0.1.0")
    response = result.get_response(as_json=True)
    assert response["model_version"] == "v0.1.0"
    assert response["outputs"][0]["parameters"] == {"content_type": {"string_param": "np"}}
    assert result.as_numpy("predict").tolist() == [mnist_svm().predict(x_test[0:1]).tolist()]
    wrong = triton_grpc.InferRequestedOutput("transform")
    with pytest.raises(InferenceServerException) as refused:
        client.infer("mnist-svm", [tensor], outputs=[wrong])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "<class 'sklearn.svm._classes.SVC'> models do not support 'transform" in refused.value.message()


# ================================================================================================ failures
def test_an_unknown_implementation_fails_its_load_naming_it(tmp_path):
    write_json(tmp_path / "custom" / "model-settings.json", {"implementation": "runtime.EchoRuntime"})
    write_json(tmp_path / "other" / "model-settings.json", json.loads('{"name": 3}'))  # skipped, logged
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path))) as running:
        (row,) = requests.post(f"{running.rest_url}/v2/repository/index", json={}, timeout=30).json()
    assert row["name"] == "custom" and row["state"] == "UNAVAILABLE"
    assert "runtime.EchoRuntime" in row["reason"]


# ================================================================================================ model-repository
def test_model_repository_example_unloads_and_loads_whole_models(tmp_path):
    """MLServer's model-repository README, as `workbench mlserver start` serves it (explicit model control, every
    model loaded at start): load and unload with no body act on the whole model, and the index lists versions by
    their strings, with no reason, as MLServer's handler lists them."""
    folder = mms_example(tmp_path)
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(folder),
        allow_pickle=True,
        model_control_mode="explicit",
        load_model=("*",),
    )

    def index(running: ServerThread) -> list[dict]:
        rows = requests.post(f"{running.rest_url}/v2/repository/index", json={}, timeout=30).json()
        return sorted(rows, key=lambda row: row["name"])

    def expected(xgboost_state: str) -> list[dict]:
        return [
            {"name": "mnist-svm", "version": "v0.1.0", "state": "READY", "reason": ""},
            {"name": "mushroom-xgboost", "version": "v0.1.0", "state": xgboost_state, "reason": ""},
        ]

    with ServerThread(options) as running:
        assert index(running) == expected("READY")
        url = f"{running.rest_url}/v2/repository/models/mushroom-xgboost"
        assert requests.post(f"{url}/unload", timeout=60).status_code == 200
        assert index(running) == expected("UNAVAILABLE")
        assert infer(running, "mushroom-xgboost", one_input(mushrooms()[0][0:1])).status_code in (400, 404, 503)
        assert requests.post(f"{url}/load", timeout=60).status_code == 200
        assert index(running) == expected("READY")
        assert infer(running, "mushroom-xgboost", one_input(mushrooms()[0][0:1])).status_code == 200


def test_a_model_without_a_version_answers_none(tmp_path):
    """The conda example's settings name no version: MLServer's answer has no model_version (REST omits it, gRPC
    leaves it empty)."""
    import joblib

    joblib.dump(mnist_svm(), tmp_path / "model.joblib")
    write_json(
        tmp_path / "model-settings.json", {"name": "mnist-svm", "implementation": "mlserver_sklearn.SKLearnModel"}
    )
    _, _, x_test, _ = digits()
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_pickle=True)
    with ServerThread(options) as running:
        answer = infer(running, "mnist-svm", one_input(x_test[0:1]))
        assert answer.status_code == 200, answer.text
        assert "model_version" not in answer.json()
        client = triton_grpc.InferenceServerClient(running.grpc_target)
        request = triton_grpc.InferInput("predict", [1, 64], "FP32")
        request.set_data_from_numpy(x_test[0:1].astype(np.float32))
        assert client.infer("mnist-svm", [request]).get_response().model_version == ""


# ================================================================================================ mlflow
def test_mlflow_example_casts_fp32_columns_and_names_the_output_as_mlserver(tmp_path):
    """The mlflow README: a model logged with FP64 columns, asked with one FP32 input per column; MLServer's MLflow
    runtime widens them and answers its numpy codec's ``output-1`` of shape [1, 1]."""
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import ElasticNet

    frame, target = load_diabetes(return_X_y=True, as_frame=True)
    model = ElasticNet(alpha=0.1).fit(frame, target)
    mlflow.sklearn.save_model(model, tmp_path / "model", signature=infer_signature(frame, model.predict(frame)))
    write_json(
        tmp_path / "model-settings.json",
        {
            "name": "wine-classifier",
            "implementation": "mlserver_mlflow.MLflowRuntime",
            "parameters": {"uri": "./model"},
        },
    )
    row = frame.iloc[0:1].astype(np.float32)
    body = {
        "inputs": [
            {"name": column, "shape": [1], "datatype": "FP32", "data": [float(row[column].iloc[0])]}
            for column in frame.columns
        ]
    }
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_pickle=True)
    with ServerThread(options) as running:
        answer = infer(running, "wine-classifier", body)
        assert answer.status_code == 200, answer.text
        (output,) = answer.json()["outputs"]
        assert output["name"] == "output-1" and output["shape"] == [1, 1] and output["datatype"] == "FP64"
        np.testing.assert_allclose(output["data"], model.predict(row.astype(np.float64)), rtol=1e-5)
        assert "model_version" not in answer.json()


# ============================================================================ models and versions found later
def test_a_model_and_a_version_added_while_serving_answer_under_their_version_strings(tmp_path):
    """A polling server finds a model-settings.json added after start-up, and a second version of a model: each is
    addressed by its version string once loaded, as at start-up, and the server stays ready."""
    import joblib

    root = tmp_path / "models"
    root.mkdir()
    (root / "first").mkdir()
    sklearn_example(root / "first")
    x = digits()[2][:1]
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(root), allow_pickle=True)
    with ServerThread(options) as server:
        assert infer(server, "mnist-svm/versions/v0.1.0", one_input(x)).status_code == 200
        (root / "second").mkdir()
        joblib.dump(mnist_svm(), root / "second" / "svm.joblib")
        write_json(
            root / "second" / "model-settings.json",
            {
                "name": "svm-two",
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./svm.joblib", "version": "v1.0.0"},
            },
        )
        (root / "first" / "v2").mkdir()
        joblib.dump(mnist_svm(), root / "first" / "v2" / "mnist-svm.joblib")
        write_json(
            root / "first" / "v2" / "model-settings.json",
            {
                "name": "mnist-svm",
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./mnist-svm.joblib", "version": "v0.2.0"},
            },
        )
        for path in ("svm-two/versions/v1.0.0", "mnist-svm/versions/v0.2.0", "mnist-svm/versions/v0.1.0"):
            answered = wait_until(
                lambda path=path: infer(server, path, one_input(x)).status_code == 200,
                timeout=120,
                what=f"{path} to answer",
            )
            assert answered
        assert requests.get(f"{server.rest_url}/v2/health/ready", timeout=10).status_code == 200


# ================================================================================================ output content types
def test_an_output_declared_or_asked_as_str_answers_as_mlservers_string_codec(tmp_path):
    """MLServer's scikit-learn runtime encodes each output by the content type the request asks for it, else the one
    model-settings.json declares (``MLModel.encode``): ``str`` is its StringCodec's BYTES, one text per row, with the
    content type on the output."""
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    iris = load_iris()
    species = np.asarray(iris.target_names)[iris.target]
    model = LogisticRegression(max_iter=1000).fit(iris.data, species)
    joblib.dump(model, tmp_path / "model.joblib")
    write_json(
        tmp_path / "model-settings.json",
        {
            "name": "species",
            "implementation": "mlserver_sklearn.SKLearnModel",
            "outputs": [{"name": "predict", "datatype": "BYTES", "parameters": {"content_type": "str"}}],
        },
    )
    write_json(
        tmp_path / "digits" / "model-settings.json",
        {"name": "digits", "implementation": "mlserver_sklearn.SKLearnModel", "parameters": {"uri": "../svm.joblib"}},
    )
    joblib.dump(mnist_svm(), tmp_path / "svm.joblib")
    rows = iris.data[[0, 60, 120]]
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_pickle=True)
    with ServerThread(options) as running:
        answer = infer(running, "species", one_input(rows))
        assert answer.status_code == 200, answer.text
        (output,) = answer.json()["outputs"]
        assert output == {
            "name": "predict",
            "shape": [3, 1],
            "datatype": "BYTES",
            "parameters": {"content_type": "str"},
            "data": model.predict(rows).tolist(),
        }
        # asked by the request: a number's text (MLServer's StringCodec encodes only text)
        x = digits()[2][:2]
        body = {**one_input(x), "outputs": [{"name": "predict", "parameters": {"content_type": "str"}}]}
        (asked,) = infer(running, "digits", body).json()["outputs"]
        expected = [str(label) for label in mnist_svm().predict(x)]
        assert (asked["datatype"], asked["shape"], asked["data"]) == ("BYTES", [2, 1], expected)
        assert asked["parameters"] == {"content_type": "str"}
        (plain,) = infer(running, "digits", one_input(x)).json()["outputs"]  # not asked: numpy's
        assert plain["datatype"] == "INT64" and plain["parameters"] == {"content_type": "np"}
        # gRPC: the same BYTES, its content type among the output's parameters
        client = triton_grpc.InferenceServerClient(running.grpc_target)
        request = triton_grpc.InferInput("predict", [3, 4], "FP64")
        request.set_data_from_numpy(rows)
        response = client.infer("species", [request]).get_response()
        (grpc_output,) = response.outputs
        assert grpc_output.datatype == "BYTES" and grpc_output.parameters["content_type"].string_param == "str"
        texts = [t.decode() for t in client.infer("species", [request]).as_numpy("predict").reshape(-1)]
        assert texts == model.predict(rows).tolist()


# ================================================================================================ edited settings
def _iris_classifier(folder: Path, uri: str = "./model.joblib", **parameters: object) -> Any:
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    iris = load_iris()
    model = LogisticRegression(max_iter=1000).fit(iris.data, iris.target)
    joblib.dump(model, folder / "model.joblib")
    _iris_settings(folder, uri, **parameters)
    return model


def _iris_settings(folder: Path, uri: str = "./model.joblib", **parameters: object) -> None:
    write_json(
        folder / "model-settings.json",
        {
            "name": "iris",
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": uri, "version": "v0.1.0", **parameters},
        },
    )


IRIS_ROW = np.asarray([[5.1, 3.5, 1.4, 0.2]])


def _answered_output(server: ServerThread) -> str | None:
    answer = infer(server, "iris/versions/v0.1.0", one_input(IRIS_ROW))
    return answer.json()["outputs"][0]["name"] if answer.status_code == 200 else None


def test_an_edited_model_settings_reloads_the_serving_version_without_a_failed_request(tmp_path):
    """A polling server reloads a version whose model-settings.json changed, as MLServer reloads a model whose settings
    changed: the new load replaces the old one once it serves, and no request fails in between."""
    import threading

    _iris_classifier(tmp_path)
    options = ServerOptions(
        rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_pickle=True, file_system_poll_wait_seconds=0.2
    )
    with ServerThread(options) as server:
        assert _answered_output(server) == "predict"
        failures: list[str] = []
        answered = [0]
        stop = threading.Event()

        def keep_asking() -> None:
            with requests.Session() as session:
                while not stop.is_set():
                    url = f"{server.rest_url}/v2/models/iris/versions/v0.1.0/infer"
                    answer = session.post(url, json=one_input(IRIS_ROW), timeout=60)
                    if answer.status_code != 200:
                        failures.append(f"{answer.status_code} {answer.text}")
                    answered[0] += 1

        asking = threading.Thread(target=keep_asking)
        asking.start()
        try:
            wait_until(lambda: answered[0] >= 3, timeout=60, what="requests before the edit")
            _iris_settings(tmp_path, extra={"predict_fn": "predict_proba"})
            wait_until(lambda: _answered_output(server) == "predict_proba", timeout=120, what="the reloaded version")
            counted = answered[0]
            wait_until(lambda: answered[0] >= counted + 3, timeout=60, what="requests after the reload")
        finally:
            stop.set()
            asking.join(timeout=60)
        assert failures == []
        (row,) = requests.post(f"{server.rest_url}/v2/repository/index", json={}, timeout=30).json()
        assert (row["version"], row["state"]) == ("v0.1.0", "READY")


def test_a_version_that_failed_to_load_loads_once_its_settings_are_fixed(tmp_path):
    """A model added while the server polls, whose settings name a file that is not there, fails its load (the
    index says why); fixing its model-settings.json loads it, addressed by its version string."""
    sklearn_example(tmp_path / "first") if (tmp_path / "first").mkdir() is None else None
    options = ServerOptions(
        rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_pickle=True, file_system_poll_wait_seconds=0.2
    )
    with ServerThread(options) as server:
        (tmp_path / "iris").mkdir()
        _iris_classifier(tmp_path / "iris", uri="./missing.joblib")

        def iris_row() -> dict | None:
            rows = requests.post(f"{server.rest_url}/v2/repository/index", json={}, timeout=30).json()
            return next((row for row in rows if row["name"] == "iris"), None)

        wait_until(lambda: (iris_row() or {}).get("state") == "UNAVAILABLE", timeout=120, what="the failed load")
        assert "missing.joblib" in iris_row()["reason"]
        _iris_settings(tmp_path / "iris")
        wait_until(lambda: _answered_output(server) == "predict", timeout=120, what="the fixed version")
        assert iris_row() == {"name": "iris", "version": "v0.1.0", "state": "READY", "reason": ""}


def test_mlserver_start_reloads_an_edited_model_when_a_client_asks_its_load(tmp_path):
    """Under `workbench mlserver start` (explicit model control), MLServer's load reloads the model's versions: the
    edited settings serve once the load has answered."""
    _iris_classifier(tmp_path)
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(tmp_path),
        allow_pickle=True,
        model_control_mode="explicit",
        load_model=("*",),
    )
    with ServerThread(options) as server:
        assert _answered_output(server) == "predict"
        _iris_settings(tmp_path, extra={"predict_fn": "predict_proba"})
        loaded = requests.post(f"{server.rest_url}/v2/repository/models/iris/load", timeout=120)
        assert loaded.status_code == 200, loaded.text
        assert _answered_output(server) == "predict_proba"
