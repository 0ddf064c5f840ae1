"""``workbench.export(model, name, registry="mlflow")``: logged with the framework's flavor, checked, registered as the
next version of the registered model, and served unchanged from ``models:/<name>``.

The tracking store is a SQLite file in the test's folder, as a notebook's embedded default is: no ``mlflow server``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier
from waiting import version_states, wait_until

import workbench
from workbench.publishing import ExportError
from workbench.server import ServerThread

mlflow = pytest.importorskip("mlflow")
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A SQLite store in ``tmp_path`` (artifacts beside it), named as a notebook names it: ``MLFLOW_TRACKING_URI``."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # MLflow's default experiment keeps its artifacts in ./mlruns
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        mlflow.set_experiment("export")
        yield uri
    finally:
        mlflow.set_tracking_uri(before)


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_iris(return_X_y=True)
    return x, y


def test_a_registry_export_registers_the_next_version_and_serves_from_models_uri(
    tracking_uri: str, iris: tuple[np.ndarray, np.ndarray], serve: Any
) -> None:
    x, y = iris
    first = LogisticRegression(max_iter=500).fit(x, y)
    second = DecisionTreeClassifier(max_depth=2, random_state=0).fit(x, y)

    one = workbench.export(first, "iris", registry="mlflow", examples=x[:5])
    with mlflow.start_run() as run:  # the user's own run: the model is logged into it
        two = workbench.export(second, "iris", registry="mlflow", examples=x[:5])

    assert (one.version, one.path, two.version, two.path) == (1, "models:/iris/1", 2, "models:/iris/2")
    assert "serving_default" in one.signatures
    client = mlflow.MlflowClient(tracking_uri)
    versions = {int(v.version): v for v in client.search_model_versions("name = 'iris'")}
    assert sorted(versions) == [1, 2]
    assert versions[2].run_id == run.info.run_id
    logged = mlflow.models.get_model_info("models:/iris/1")
    assert logged.flavors.keys() >= {"sklearn", "python_function"}
    assert logged.signature is not None and logged.saved_input_example_info is not None

    server = serve(model_name="iris", model_base_path="models:/iris", mlflow_tracking_uri=tracking_uri)
    wait_until(
        lambda: version_states(server.rest_url, "iris").get("2") == "AVAILABLE",
        timeout=120,
        what="iris v2 served from the registry",
    )
    # The latest version serves (the default version policy), with the answers the notebook's object gives.
    answer = requests.post(f"{server.rest_url}/v1/models/iris:predict", json={"instances": x[:8].tolist()}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert np.asarray(answer.json()["predictions"]).ravel().tolist() == second.predict(x[:8]).tolist()


def test_a_registry_export_refuses_what_only_a_folder_holds_and_registers_nothing(
    tracking_uri: str, iris: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = iris
    model = LogisticRegression(max_iter=500).fit(x, y)
    with pytest.raises(ExportError, match="takes no version"):
        workbench.export(model, "refused", registry="mlflow", examples=x[:2], version=3)
    with pytest.raises(ExportError, match="needs examples"):
        workbench.export(model, "refused", registry="mlflow")
    with pytest.raises(ExportError, match="Unknown registry"):
        workbench.export(model, "refused", registry="sagemaker", examples=x[:2])
    with pytest.raises(ExportError, match="is none of these"):
        workbench.export(object(), "refused", registry="mlflow", examples=x[:2])
    assert mlflow.MlflowClient(tracking_uri).search_registered_models() == []


# ------------------------------------------------------------------------------------------------ each flavor
# A model of each flavor a registry export logs natively besides scikit-learn's: the model, its examples, and what it
# answers in-process (MLflow's pyfunc answers the same: the wrapper's predict, or a booster's own).
Flavored = tuple[Any, Any, Callable[[np.ndarray], np.ndarray]]


def _xgb_classifier(x: np.ndarray, y: np.ndarray) -> Flavored:
    import xgboost

    model = xgboost.XGBClassifier(n_estimators=8, max_depth=3, n_jobs=1).fit(x, y)
    return model, x[:5], model.predict


def _xgb_booster(x: np.ndarray, y: np.ndarray) -> Flavored:
    import xgboost

    params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 3, "nthread": 1}
    booster = xgboost.train(params, xgboost.DMatrix(x, label=y), num_boost_round=8)
    return booster, x[:5], lambda rows: booster.predict(xgboost.DMatrix(rows))  # the probabilities


def _lgbm_classifier(x: np.ndarray, y: np.ndarray) -> Flavored:
    import lightgbm

    model = lightgbm.LGBMClassifier(n_estimators=8, num_leaves=7, n_jobs=1, verbose=-1).fit(x, y)
    return model, x[:5], model.predict


def _lgbm_booster(x: np.ndarray, y: np.ndarray) -> Flavored:
    import lightgbm

    params = {"objective": "multiclass", "num_class": 3, "num_leaves": 7, "num_threads": 1, "verbose": -1}
    booster = lightgbm.train(params, lightgbm.Dataset(x, label=y), num_boost_round=8)
    return booster, x[:5], booster.predict  # the probabilities


def _onnx_from_skl2onnx(x: np.ndarray, y: np.ndarray) -> Flavored:
    import onnxruntime
    from skl2onnx import to_onnx

    fitted = LogisticRegression(max_iter=500).fit(x.astype(np.float32), y)
    # No ZipMap: the probabilities as a tensor, which MLflow's onnx flavor and a server both answer.
    model = to_onnx(fitted, x[:1].astype(np.float32), options={id(fitted): {"zipmap": False}})
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (feed,) = (i.name for i in session.get_inputs())
    return model, {feed: x[:5].astype(np.float32)}, lambda rows: session.run(None, {feed: rows.astype(np.float32)})


FLAVORED: dict[str, Callable[[np.ndarray, np.ndarray], Flavored]] = {
    "xgb-classifier": _xgb_classifier,
    "xgb-booster": _xgb_booster,
    "lgbm-classifier": _lgbm_classifier,
    "lgbm-booster": _lgbm_booster,
    "onnx": _onnx_from_skl2onnx,
}


@pytest.mark.parametrize("kind", sorted(FLAVORED))
def test_each_flavor_exports_to_the_registry_and_serves_from_models_uri_as_it_answers_in_process(
    kind: str, tracking_uri: str, iris: tuple[np.ndarray, np.ndarray], serve: Callable[..., ServerThread]
) -> None:
    x, y = iris
    model, examples, in_process = FLAVORED[kind](x, y)
    exported = workbench.export(model, kind, registry="mlflow", examples=examples)
    assert (exported.version, exported.path) == (1, f"models:/{kind}/1")
    rows = x[::15]  # every class
    expected = in_process(rows)
    # What `mlflow models serve` answers: MLflow's own pyfunc on the registered version.
    feed = {next(iter(examples)): rows.astype(np.float32)} if kind == "onnx" else rows  # ONNX: its named input
    pyfunc = mlflow.pyfunc.load_model(exported.path).predict(feed)

    # A LightGBM estimator is logged as skops, which only MLflow's Python loads; the others load natively.
    server = serve(
        model_name=kind,
        model_base_path=f"models:/{kind}",
        mlflow_tracking_uri=tracking_uri,
        allow_python_models=kind == "lgbm-classifier",
    )
    # Settled either way: a version that fails to load says why at once, instead of after the whole timeout.
    wait_until(
        lambda: version_states(server.rest_url, kind).get("1") in ("AVAILABLE", "END"),
        timeout=120,
        what=f"{kind} v1 loaded from the registry",
    )
    (status,) = requests.get(f"{server.rest_url}/v1/models/{kind}", timeout=10).json()["model_version_status"]
    assert status["state"] == "AVAILABLE", status["status"]
    answer = requests.post(f"{server.rest_url}/v1/models/{kind}:predict", json={"inputs": rows.tolist()}, timeout=30)
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["outputs"]
    if kind == "onnx":
        label, probabilities = expected
        assert set(outputs) == {"label", "probabilities"}
        assert outputs["label"] == label.tolist() == np.asarray(pyfunc["label"]).tolist()
        np.testing.assert_array_equal(np.asarray(outputs["probabilities"], np.float32), probabilities)
        return
    served = np.asarray(outputs, dtype=np.asarray(expected).dtype)
    np.testing.assert_array_equal(served, expected)
    np.testing.assert_array_equal(served, np.asarray(pyfunc, dtype=served.dtype).reshape(served.shape))
