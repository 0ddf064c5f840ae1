"""MLflow models served by workbench, answering MLflow's scoring protocol as ``mlflow models serve`` does.

A scikit-learn model logged with ``mlflow.sklearn.save_model`` (iris, fit on a DataFrame: a column-based signature)
and an XGBoost one (digits, fit on a matrix: a tensor signature) in a TF Serving-style repository; ``/invocations``
is compared, body for body and status for status, with the real ``mlflow models serve`` on the same folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.mlflow_serving import mlflow_models_serve
from workbench.config.options import ServerOptions
from workbench.server import ServerThread

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import mlflow.sklearn
    import mlflow.xgboost
    import xgboost
    from mlflow.models import infer_signature
    from sklearn.datasets import load_digits, load_iris
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("mlflow-repository")
    frame, labels = load_iris(return_X_y=True, as_frame=True)
    iris = LogisticRegression(max_iter=1000).fit(frame, labels)
    signature = infer_signature(frame, iris.predict(frame))
    mlflow.sklearn.save_model(iris, root / "iris" / "1", signature=signature, input_example=frame.head(3))

    pixels, digits = load_digits(return_X_y=True)
    booster = xgboost.XGBClassifier(n_estimators=4, max_depth=3).fit(pixels, digits)
    signature = infer_signature(pixels, booster.predict(pixels))
    mlflow.xgboost.save_model(booster, root / "digits" / "1", signature=signature, input_example=pixels[:2])
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository), mlflow_scoring_model="iris")
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def reference(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real ``mlflow models serve`` on the iris folder: one process for the module."""
    log = tmp_path_factory.mktemp("mlflow-serve") / "serve.log"
    with mlflow_models_serve(repository / "iris" / "1", log) as url:
        yield url


def iris_rows(n: int = 5) -> Any:
    from sklearn.datasets import load_iris

    frame, _ = load_iris(return_X_y=True, as_frame=True)
    return frame.iloc[::30].head(n)


def invocations(url: str, body: Any, content_type: str = "application/json") -> requests.Response:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return requests.post(f"{url}/invocations", data=data, headers={"Content-Type": content_type}, timeout=60)


def iris_requests() -> dict[str, tuple[Any, str]]:
    """The same rows in every body format /invocations takes."""
    rows = iris_rows()
    split = json.loads(rows.to_json(orient="split"))
    split.pop("index")
    records = json.loads(rows.to_json(orient="records"))
    columns = {name: rows[name].tolist() for name in rows.columns}
    return {
        "dataframe_split": ({"dataframe_split": split}, "application/json"),
        "dataframe_records": ({"dataframe_records": records}, "application/json"),
        "instances": ({"instances": records}, "application/json"),
        "inputs": ({"inputs": columns}, "application/json"),
        "csv": (rows.to_csv(index=False), "text/csv"),
        "json with charset": ({"dataframe_split": split}, "application/json; charset=utf-8"),
    }


# =========================================================================================== the platform
def test_mlflow_folder_serves_with_its_signature(server: ServerThread) -> None:
    metadata = requests.get(f"{server.rest_url}/v2/models/iris", timeout=30).json()
    assert metadata["platform"] == "mlflow"
    assert [i["name"] for i in metadata["inputs"]] == [
        "sepal length (cm)",
        "sepal width (cm)",
        "petal length (cm)",
        "petal width (cm)",
    ]
    assert {i["datatype"] for i in metadata["inputs"]} == {"FP64"}
    digits = requests.get(f"{server.rest_url}/v2/models/digits", timeout=30).json()
    assert [(i["name"], i["shape"]) for i in digits["inputs"]] == [("inputs", [-1, 64])]


def test_v2_and_tf_serving_rest_answer_as_the_model(server: ServerThread) -> None:
    rows = iris_rows()
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    frame, labels = load_iris(return_X_y=True, as_frame=True)
    expected = LogisticRegression(max_iter=1000).fit(frame, labels).predict(rows).tolist()
    v2 = {
        "inputs": [
            {"name": name, "shape": [len(rows)], "datatype": "FP64", "data": rows[name].tolist()}
            for name in rows.columns
        ]
    }
    answer = requests.post(f"{server.rest_url}/v2/models/iris/infer", json=v2, timeout=30).json()
    assert answer["outputs"][0]["data"] == expected
    tf = {"inputs": {name: rows[name].tolist() for name in rows.columns}}
    answer = requests.post(f"{server.rest_url}/v1/models/iris:predict", json=tf, timeout=30).json()
    assert answer["outputs"] == expected
    # The native platform's other signatures stay: predict_proba, over TF Serving's REST.
    proba = {"signature_name": "predict_proba", "instances": rows.to_numpy().tolist()}
    answer = requests.post(f"{server.rest_url}/v1/models/iris:predict", json=proba, timeout=30).json()
    assert np.asarray(answer["predictions"]).shape == (len(rows), 3)


def test_tensor_signature_serves_its_matrix(server: ServerThread) -> None:
    from sklearn.datasets import load_digits

    pixels, _ = load_digits(return_X_y=True)
    body = {"instances": pixels[:3].tolist()}
    answer = requests.post(f"{server.rest_url}/v1/models/digits:predict", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["predictions"]) == 3


# =========================================================================================== /invocations
@pytest.mark.parametrize("form", list(iris_requests()))
def test_invocations_answers_as_mlflow_models_serve(server: ServerThread, reference: str, form: str) -> None:
    body, content_type = iris_requests()[form]
    ours = invocations(server.rest_url, body, content_type)
    theirs = invocations(reference, body, content_type)
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json()), ours.text
    assert ours.status_code == 200 and len(ours.json()["predictions"]) == 5


BAD_REQUESTS = {
    "not json": ("{nope", "application/json"),
    "a list": ("[1, 2]", "application/json"),
    "no format key": ({"data": [[1, 2, 3, 4]]}, "application/json"),
    "two format keys": ({"inputs": [[1, 2, 3, 4]], "instances": [[1, 2, 3, 4]]}, "application/json"),
    "split without data": ({"dataframe_split": {"columns": ["a"]}}, "application/json"),
    "records not a list": ({"dataframe_records": {"a": 1}}, "application/json"),
    "a column that is not a number": (
        {"dataframe_records": [{**{c: 1.0 for c in iris_rows().columns}, "sepal length (cm)": "x"}]},
        "application/json",
    ),
    "a missing column": (
        {"dataframe_records": [{c: 1.0 for c in list(iris_rows().columns)[:3]}]},
        "application/json",
    ),
    "unknown content type": ("a,b\n1,2", "text/plain"),
    "another charset": ({"inputs": [[1, 2, 3, 4]]}, "application/json; charset=latin-1"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_are_refused_as_mlflow_refuses_them(server: ServerThread, reference: str, case: str) -> None:
    body, content_type = BAD_REQUESTS[case]
    ours = invocations(server.rest_url, body, content_type)
    theirs = invocations(reference, body, content_type)
    assert ours.status_code == theirs.status_code, (ours.text, theirs.text)
    assert ours.status_code in (400, 415)
    if ours.status_code == 400:
        assert ours.json()["error_code"] == theirs.json()["error_code"]
        assert ours.json()["message"]


def test_missing_column_is_a_bad_request(server: ServerThread) -> None:
    records = json.loads(iris_rows().drop(columns=["petal width (cm)"]).to_json(orient="records"))
    answer = invocations(server.rest_url, {"dataframe_records": records})
    assert answer.status_code == 400
    # MLflow says INVALID_PARAMETER_VALUE for data its schema enforcement refuses (BAD_REQUEST for what it cannot read)
    assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE" and "petal width (cm)" in answer.json()["message"]


def test_health_and_version_answer_as_mlflow(server: ServerThread, reference: str) -> None:
    for path in ("/health", "/ping"):
        assert requests.get(f"{server.rest_url}{path}", timeout=30).status_code == 200
    ours = requests.get(f"{server.rest_url}/version", timeout=30)
    theirs = requests.get(f"{reference}/version", timeout=30)
    assert (ours.status_code, ours.text) == (theirs.status_code, theirs.text)
    ours = requests.get(f"{server.rest_url}/health", timeout=30)
    theirs = requests.get(f"{reference}/health", timeout=30)
    assert (ours.status_code, ours.text) == (theirs.status_code, theirs.text)


def test_several_models_without_the_flag_are_named(repository: Path) -> None:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository))
    with ServerThread(options) as running:
        answer = invocations(running.rest_url, {"inputs": [[1.0, 2.0, 3.0, 4.0]]})
    assert answer.status_code == 400
    assert answer.json()["error_code"] == "BAD_REQUEST"
    assert "digits" in answer.json()["message"] and "iris" in answer.json()["message"]
    assert "--mlflow_scoring_model" in answer.json()["message"]
