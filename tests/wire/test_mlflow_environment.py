"""An MLflow model logged with packages the server does not run: it serves (nothing is installed), and the version's
status says so wherever a client looks, not only in the server's log: the model's description, the v2 repository
index's reason and its REST metadata's parameters, for a TF Serving-style folder and for MLServer's MLflow runtime."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc

from workbench.config.options import ServerOptions
from workbench.server import ServerThread

mlflow = pytest.importorskip("mlflow")

PINS = ["scikit-learn==0.20.0", "workbench-no-such-package==1.0"]


def _save(folder: Path) -> None:
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    frame, labels = load_iris(return_X_y=True, as_frame=True)
    model = LogisticRegression(max_iter=500).fit(frame, labels)
    signature = infer_signature(frame, model.predict(frame))
    mlflow.sklearn.save_model(model, folder, signature=signature, pip_requirements=PINS)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("environment")
    _save(root / "tf" / "iris" / "1")
    config = root / "models.config"
    config.write_text(f'model_config_list {{\n  config {{ name: "iris" base_path: "{root / "tf" / "iris"}" }}\n}}\n')
    options = ServerOptions(rest_api_port=-1, port=0, model_config_file=str(config), allow_pickle=True)
    with ServerThread(options) as running:
        yield running


def _says_the_pins(text: str) -> None:
    assert "scikit-learn==0.20.0 (installed:" in text, text
    assert "workbench-no-such-package==1.0 (not installed)" in text, text


def test_the_version_serves_and_its_status_names_the_mismatches(server: ServerThread) -> None:
    row = {"sepal length (cm)": 5.1, "sepal width (cm)": 3.5, "petal length (cm)": 1.4, "petal width (cm)": 0.2}
    answer = requests.post(f"{server.rest_url}/invocations", json={"dataframe_records": [row]}, timeout=30)
    assert answer.status_code == 200, answer.text

    described = requests.get(f"{server.rest_url}/workbench/v1/models/iris", timeout=10).json()
    (version,) = described["versions"]
    assert version["state"] == "AVAILABLE"
    _says_the_pins(" ".join(version["warnings"]))

    index = requests.post(f"{server.rest_url}/v2/repository/index", json={}, timeout=10).json()
    (listed,) = [entry for entry in index if entry["name"] == "iris"]
    assert listed["state"] == "READY"
    _says_the_pins(listed["reason"])

    metadata = requests.get(f"{server.rest_url}/v2/models/iris", timeout=10).json()
    _says_the_pins(metadata["parameters"]["load_warnings"])
    # gRPC's ModelMetadataResponse has no parameters: the rest of the answer is unchanged
    grpc_metadata = triton_grpc.InferenceServerClient(server.grpc_target).get_model_metadata("iris")
    assert grpc_metadata.name == "iris" and len(grpc_metadata.inputs) == 4


def test_mlservers_mlflow_runtime_reports_them_too(tmp_path: Path) -> None:
    _save(tmp_path / "model")
    (tmp_path / "model-settings.json").write_text(
        json.dumps(
            {"name": "wine", "implementation": "mlserver_mlflow.MLflowRuntime", "parameters": {"uri": "./model"}}
        )
    )
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path), allow_pickle=True)
    with ServerThread(options) as running:
        body = {
            "inputs": [
                {"name": name, "shape": [1], "datatype": "FP32", "data": [value]}
                for name, value in zip(
                    ["sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)"],
                    np.asarray([5.1, 3.5, 1.4, 0.2]).tolist(),
                    strict=True,
                )
            ]
        }
        answer = requests.post(f"{running.rest_url}/v2/models/wine/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        (listed,) = requests.post(f"{running.rest_url}/v2/repository/index", json={}, timeout=10).json()
        assert listed["state"] == "READY"
        _says_the_pins(listed["reason"])
        _says_the_pins(
            requests.get(f"{running.rest_url}/v2/models/wine", timeout=10).json()["parameters"]["load_warnings"]
        )
