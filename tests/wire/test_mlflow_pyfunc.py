"""A custom MLflow ``PythonModel`` (models from code, with params) served by workbench through MLflow's pyfunc, and
compared with the real ``mlflow models serve`` on the same folder; and what a repository may run: a pyfunc model is
Python, loaded only where the server runs Python models."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.mlflow_serving import mlflow_models_serve
from workbench.config.options import ServerOptions
from workbench.server import ServerThread

pytestmark = pytest.mark.timeout(900)

# The model's code, as MLflow's models-from-code logs it: answers a DataFrame of two named columns, scaled by a param.
MODEL_CODE = textwrap.dedent(
    """
    import mlflow
    import pandas as pd


    class Scaler(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            scale = (params or {}).get("scale", 1.0)
            total = (model_input["a"] + model_input["b"]) * scale
            greeting = "hello " + model_input["name"]
            return pd.DataFrame({"total": total, "greeting": greeting})


    mlflow.models.set_model(Scaler())
    """
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import mlflow.pyfunc
    import pandas as pd
    from mlflow.models import infer_signature

    root = tmp_path_factory.mktemp("mlflow-pyfunc")
    code = root / "scaler_code.py"
    code.write_text(MODEL_CODE)
    example = pd.DataFrame({"a": [1.0, 2.5], "b": [2, 3], "name": ["ada", "bob"]})
    answer = pd.DataFrame({"total": [3.0, 5.5], "greeting": ["hello ada", "hello bob"]})
    signature = infer_signature(example, answer, params={"scale": 1.0})
    mlflow.pyfunc.save_model(root / "scaler" / "1", python_model=str(code), signature=signature, input_example=example)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def reference(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("mlflow-serve") / "serve.log"
    with mlflow_models_serve(repository / "scaler" / "1", log) as url:
        yield url


def invocations(url: str, body: Any, content_type: str = "application/json") -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body)
    return requests.post(f"{url}/invocations", data=data, headers={"Content-Type": content_type}, timeout=60)


ROWS = [{"a": 1.5, "b": 2, "name": "ada"}, {"a": -1.0, "b": 7, "name": "cy"}]
REQUESTS: dict[str, tuple[Any, str]] = {
    "records": ({"dataframe_records": ROWS}, "application/json"),
    "split with params": (
        {
            "dataframe_split": {"columns": ["a", "b", "name"], "data": [[1.5, 2, "ada"], [-1.0, 7, "cy"]]},
            "params": {"scale": 2.0},
        },
        "application/json",
    ),
    "instances": ({"instances": ROWS, "params": {"scale": 0.5}}, "application/json"),
    "inputs": ({"inputs": {"a": [1.5, -1.0], "b": [2, 7], "name": ["ada", "cy"]}}, "application/json"),
    "csv": ("a,b,name\n1.5,2,ada\n-1.0,7,cy\n", "text/csv"),
}


@pytest.mark.parametrize("form", list(REQUESTS))
def test_pyfunc_answers_as_mlflow_models_serve(server: ServerThread, reference: str, form: str) -> None:
    body, content_type = REQUESTS[form]
    ours = invocations(server.rest_url, body, content_type)
    theirs = invocations(reference, body, content_type)
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json()), ours.text
    assert ours.status_code == 200


def test_params_reach_predict(server: ServerThread) -> None:
    answer = invocations(server.rest_url, {"dataframe_records": ROWS[:1], "params": {"scale": 10.0}})
    assert answer.json() == {"predictions": [{"total": 35.0, "greeting": "hello ada"}]}


def test_v2_sends_columns_and_params_as_inputs(server: ServerThread) -> None:
    metadata = requests.get(f"{server.rest_url}/v2/models/scaler", timeout=30).json()
    assert [i["name"] for i in metadata["inputs"]] == ["a", "b", "name", "scale"]
    body = {
        "inputs": [
            {"name": "a", "shape": [1], "datatype": "FP64", "data": [1.0]},
            {"name": "b", "shape": [1], "datatype": "INT64", "data": [1]},
            {"name": "name", "shape": [1], "datatype": "BYTES", "data": ["x"]},
            {"name": "scale", "shape": [], "datatype": "FP64", "data": [3.0]},
        ]
    }
    answer = requests.post(f"{server.rest_url}/v2/models/scaler/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs == {"total": [6.0], "greeting": ["hello x"]}


def test_bad_requests_are_refused_as_mlflow_refuses_them(server: ServerThread, reference: str) -> None:
    for body in ({"dataframe_records": [{"a": 1.0, "b": 2}]}, {"dataframe_records": [{"a": "x", "b": 2, "name": "n"}]}):
        ours, theirs = invocations(server.rest_url, body), invocations(reference, body)
        assert ours.status_code == theirs.status_code == 400, (ours.text, theirs.text)
        assert ours.json()["error_code"] == theirs.json()["error_code"]


def test_pyfunc_models_need_python_allowed(repository: Path) -> None:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository))
    with ServerThread(options) as running:
        status = requests.get(f"{running.rest_url}/v1/models/scaler", timeout=30).json()
    (version,) = status["model_version_status"]
    assert version["state"] == "END"
    assert "--allow_python_models" in version["status"]["error_message"]
