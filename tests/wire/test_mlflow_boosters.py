"""Boosters logged by MLflow's ``xgboost`` and ``lightgbm`` flavors load natively (no Python run from the folder) and
answer ``serving_default`` exactly as MLflow's pyfunc answers, which is what ``mlflow models serve`` answers: the
booster's own predict (a multiclass booster's probabilities, a binary one's probability, a regressor's values).
A LightGBM scikit-learn wrapper is a serialized Python object: it stays on pyfunc.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_iris

from workbench.core import inference
from workbench.core.errors import ServingError
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms import Loader, LoadPolicy

mlflow = pytest.importorskip("mlflow")
lightgbm = pytest.importorskip("lightgbm")
xgboost = pytest.importorskip("xgboost")

NATIVE_ONLY = Loader(LoadPolicy(allow_pickle=False, allow_python=False))


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_iris(return_X_y=True)
    return x, y


def _lightgbm(objective: str, **params: Any) -> Callable[[np.ndarray, np.ndarray], Any]:
    def train(x: np.ndarray, y: np.ndarray) -> Any:
        labels = (y == 2).astype(float) if objective == "binary" else y
        settings = {"objective": objective, "num_leaves": 7, "num_threads": 1, "verbose": -1, **params}
        return lightgbm.train(settings, lightgbm.Dataset(x, label=labels), num_boost_round=6)

    return train


def _xgboost(objective: str, **params: Any) -> Callable[[np.ndarray, np.ndarray], Any]:
    def train(x: np.ndarray, y: np.ndarray) -> Any:
        labels = (y == 2).astype(float) if objective.startswith("binary:") else y
        settings = {"objective": objective, "max_depth": 3, "nthread": 1, **params}
        return xgboost.train(settings, xgboost.DMatrix(x, label=labels), num_boost_round=6)

    return train


BOOSTERS: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], Any]]] = {
    "lightgbm-multiclass": ("lightgbm", _lightgbm("multiclass", num_class=3)),
    "lightgbm-binary": ("lightgbm", _lightgbm("binary")),
    "lightgbm-regression": ("lightgbm", _lightgbm("regression")),
    "xgboost-softprob": ("xgboost", _xgboost("multi:softprob", num_class=3)),
    "xgboost-logistic": ("xgboost", _xgboost("binary:logistic")),
}


@pytest.mark.parametrize("kind", sorted(BOOSTERS))
def test_a_logged_booster_answers_natively_as_mlflows_pyfunc(
    kind: str, tmp_path: Path, iris: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = iris
    flavor, train = BOOSTERS[kind]
    folder = tmp_path / kind
    getattr(mlflow, flavor).save_model(train(x, y), str(folder), input_example=x[:3])

    servable = NATIVE_ONLY(kind, 1, str(folder))  # no Python allowed: a pyfunc load would be refused
    try:
        assert servable.flavor == flavor  # type: ignore[attr-defined]
        rows = x[::7]
        signature = servable.signatures[DEFAULT_SIGNATURE]
        (alias,) = signature.inputs
        (answer,) = inference.predict(servable, signature, {alias: rows}).values()
    finally:
        servable.close()
    expected = np.asarray(mlflow.pyfunc.load_model(str(folder)).predict(rows))
    assert answer.dtype == expected.dtype and answer.shape == expected.shape
    np.testing.assert_array_equal(answer, expected)


def test_a_lightgbm_estimator_stays_on_pyfunc(tmp_path: Path, iris: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = iris
    model = lightgbm.LGBMClassifier(n_estimators=4, num_leaves=7, n_jobs=1, verbose=-1).fit(x, y)
    mlflow.lightgbm.save_model(model, str(tmp_path / "estimator"), input_example=x[:3])
    with pytest.raises(ServingError, match="allow_python_models"):
        NATIVE_ONLY("estimator", 1, str(tmp_path / "estimator"))
    servable = Loader(LoadPolicy(allow_pickle=False, allow_python=True))("estimator", 1, str(tmp_path / "estimator"))
    try:
        assert servable.flavor == "python_function"  # type: ignore[attr-defined]
    finally:
        servable.close()
