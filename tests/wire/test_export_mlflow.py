"""``workbench.export(model, name, registry="mlflow")``: logged with the framework's flavor, checked, registered as the
next version of the registered model, and served unchanged from ``models:/<name>``.

The tracking store is a SQLite file in the test's folder, as a notebook's embedded default is: no ``mlflow server``.
"""

from __future__ import annotations

from collections.abc import Iterator
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

mlflow = pytest.importorskip("mlflow")


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
