"""``workbench.export`` for every platform: the version is written in the platform's format, checked and warmed by
loading it as the server will, and served with the same answers as the object the notebook holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import requests
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from waiting import version_states, wait_until

import workbench
from workbench.client import Client
from workbench.models.warmup_replay import WARMUP_FILE
from workbench.publishing import ExportError


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return x, y


@pytest.fixture(scope="module")
def classifier(digits: tuple[np.ndarray, np.ndarray]) -> object:
    x, y = digits
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)


def served_predictions(server, model: str, rows: np.ndarray) -> list:
    url = f"{server.rest_url}/v1/models/{model}"
    wait_until(lambda: version_states(server.rest_url, model).get("1") == "AVAILABLE", what=f"{model} v1")
    answer = requests.post(f"{url}:predict", json={"instances": rows.tolist()}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def test_every_tabular_framework_exports_and_serves_the_notebooks_answers(
    tmp_path: Path, serve, digits: tuple[np.ndarray, np.ndarray], classifier: object
) -> None:
    import lightgbm
    import xgboost

    x, y = digits
    rows = x[:16]
    models = {
        "sk": (classifier, "model.skops"),
        "xgb": (xgboost.XGBClassifier(n_estimators=10, max_depth=3).fit(x, y), "model.ubj"),
        "lgbm": (lightgbm.LGBMClassifier(n_estimators=10, verbose=-1).fit(x, y), "model.txt"),
    }
    repository = tmp_path / "models"
    for name, (model, file) in models.items():
        result = workbench.export(model, name, repository, examples=rows)
        assert (result.version, (result.path / file).is_file()) == (1, True)
        assert result.warmup_records == 1 and (result.path / WARMUP_FILE).is_file()
        assert "serving_default" in result.signatures
    server = serve(model_repository=str(repository))
    client = Client(server.rest_url, f"127.0.0.1:{server.server.grpc_port}")
    for name, (model, _) in models.items():
        assert served_predictions(server, name, rows) == model.predict(rows).tolist(), name
        # :classify without a signature name finds the classify signature (serving_default is a predict here).
        for protocol in ("rest", "grpc"):
            classified = client.classify(name, [{"x": row} for row in rows[:3]], protocol=protocol)
            best = [int(max(row, key=lambda pair: pair[1])[0]) for row in classified]
            assert best == model.predict(rows[:3]).tolist(), (name, protocol)


def test_a_catboost_model_exports_as_model_cbm_and_serves_its_answers(
    tmp_path: Path, serve, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    catboost = pytest.importorskip("catboost")
    x, y = digits
    rows = x[:16]
    settings = {"iterations": 10, "depth": 3, "verbose": False, "allow_writing_files": False, "thread_count": 1}
    models = {
        "cb-classes": catboost.CatBoostClassifier(**settings).fit(x, y),
        "cb-values": catboost.CatBoostRegressor(**settings).fit(x, y.astype(np.float64)),
    }
    repository = tmp_path / "models"
    for name, model in models.items():
        result = workbench.export(model, name, repository, examples=rows)
        assert (result.version, (result.path / "model.cbm").is_file()) == (1, True)
    server = serve(model_repository=str(repository))
    expected_classes = models["cb-classes"].predict(rows).reshape(-1).tolist()
    assert served_predictions(server, "cb-classes", rows) == expected_classes
    np.testing.assert_allclose(served_predictions(server, "cb-values", rows), models["cb-values"].predict(rows))


def test_an_onnx_model_and_a_converted_estimator_export_and_serve(
    tmp_path: Path, serve, digits: tuple[np.ndarray, np.ndarray], classifier: object
) -> None:
    import onnxruntime

    x, _ = digits
    rows = x[:16].astype(np.float32)
    repository = tmp_path / "models"
    converted = workbench.export(classifier, "converted", repository, examples=rows, format="onnx")
    assert (converted.path / "model.onnx").is_file()
    # The written ONNX model, handed over again as bytes: the ONNX platform's own export.
    again = workbench.export((converted.path / "model.onnx").read_bytes(), "onnx_bytes", repository)
    assert (again.path / "model.onnx").read_bytes() == (converted.path / "model.onnx").read_bytes()

    session = onnxruntime.InferenceSession(str(converted.path / "model.onnx"), providers=["CPUExecutionProvider"])
    (input_name,) = [i.name for i in session.get_inputs()]
    labels = session.run(None, {input_name: rows})[0].tolist()
    assert labels == classifier.predict(rows).tolist()  # the conversion kept the answers

    server = serve(model_repository=str(repository))
    for name in ("converted", "onnx_bytes"):
        url = f"{server.rest_url}/v1/models/{name}"
        wait_until(lambda n=name: version_states(server.rest_url, n).get("1") == "AVAILABLE", what=name)
        answer = requests.post(f"{url}:predict", json={"inputs": {input_name: rows.tolist()}}, timeout=30)
        assert answer.status_code == 200, answer.text
        outputs = answer.json()["outputs"]
        assert next(v for v in outputs.values() if np.asarray(v).ndim == 1) == labels


def test_converting_to_onnx_needs_examples_to_know_the_input(tmp_path: Path, classifier: object) -> None:
    with pytest.raises(ExportError, match="needs examples="):
        workbench.export(classifier, "m", tmp_path, format="onnx")
    assert not (tmp_path / "m").exists()


def test_an_unknown_format_is_refused(tmp_path: Path, classifier: object) -> None:
    with pytest.raises(ExportError, match="format must be 'onnx'"):
        workbench.export(classifier, "m", tmp_path, format="pmml")


class Doubling(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 2])}
    outputs = {"y": ("float32", [-1, 2])}

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"] * 2}


def test_a_python_model_class_exports_and_serves_only_where_python_models_are_allowed(tmp_path: Path, serve) -> None:
    repository = tmp_path / "models"
    result = workbench.export(Doubling, "double", repository, examples={"x": [[1.0, 2.0]]})
    assert (result.path / "model.py").is_file() and result.warmup_records == 1
    refused = serve(model_repository=str(repository))
    wait_until(lambda: version_states(refused.rest_url, "double").get("1") == "END", what="the refusal")
    status = requests.get(f"{refused.rest_url}/v1/models/double", timeout=30).json()
    assert "--allow_python_models" in status["model_version_status"][0]["status"]["error_message"]

    allowed = serve(model_repository=str(repository), allow_python_models=True)
    assert served_predictions(allowed, "double", np.array([[1.0, 2.0]])) == [[2.0, 4.0]]


def test_a_pipeline_description_exports_as_pipeline_yaml_and_chains_its_members(tmp_path: Path, serve) -> None:
    repository = tmp_path / "models"
    workbench.export(Doubling, "double", repository)
    pipeline = workbench.Pipeline(
        inputs={"x": ("float32", [-1, 2])},
        outputs={"z": ("float32", [-1, 2])},
        steps=[
            workbench.Step(name="first", model="double", inputs={"x": "x"}, outputs={"y": "twice"}),
            workbench.Step(name="second", model="double", inputs={"x": "twice"}, outputs={"y": "z"}),
        ],
    )
    result = workbench.export(pipeline, "quadruple", repository)
    document = (result.path / "pipeline.yaml").read_text()
    assert "first" in document and "second" in document
    server = serve(model_repository=str(repository), allow_python_models=True)
    assert served_predictions(server, "quadruple", np.array([[1.0, 2.0]])) == [[4.0, 8.0]]
    status = json.loads(requests.get(f"{server.rest_url}/v1/models/quadruple", timeout=30).text)
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
