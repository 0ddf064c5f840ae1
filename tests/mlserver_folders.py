"""Folders laid out as MLServer's examples lay them out (docs/examples/sklearn, xgboost, lightgbm, mms), with their
models trained here: scikit-learn's digits and iris, and an XGBoost booster trained on a small mushroom-like table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

SETTINGS = {"debug": "true"}  # the examples' settings.json


def write_json(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=4))


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The sklearn example's split: the first half of digits trains, the second is X_test."""
    from sklearn import datasets

    data = datasets.load_digits()
    flat = data.images.reshape((len(data.images), -1))
    half = len(flat) // 2
    return flat[:half], data.target[:half], flat[half:], data.target[half:]


def mnist_svm() -> Any:
    from sklearn import svm

    x_train, y_train, _, _ = digits()
    return svm.SVC(gamma=0.001).fit(x_train, y_train)


def mushrooms() -> tuple[np.ndarray, np.ndarray]:
    """126 binary features, as agaricus.txt has; the label is a rule on a few of them."""
    rows = np.random.default_rng(0).integers(0, 2, size=(400, 126)).astype(np.float64)
    return rows, ((rows[:, 3] + rows[:, 10] + rows[:, 20]) >= 2).astype(np.float64)


def mushroom_xgboost() -> Any:
    """The xgboost example's booster: xgb.train with binary:logistic, max_depth 2, eta 1, two rounds."""
    import xgboost as xgb

    rows, labels = mushrooms()
    return xgb.train({"max_depth": 2, "eta": 1, "objective": "binary:logistic"}, xgb.DMatrix(rows, label=labels), 2)


def iris_lightgbm() -> Any:
    import lightgbm as lgb
    from sklearn.datasets import load_iris

    iris = load_iris()
    params = {"objective": "multiclass", "metric": "softmax", "num_class": 3, "verbose": -1}
    return lgb.train(params=params, train_set=lgb.Dataset(iris["data"], label=iris["target"]), num_boost_round=10)


def sklearn_example(folder: Path) -> Path:
    import joblib

    joblib.dump(mnist_svm(), folder / "mnist-svm.joblib")
    write_json(folder / "settings.json", SETTINGS)
    write_json(
        folder / "model-settings.json",
        {
            "name": "mnist-svm",
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": "./mnist-svm.joblib", "version": "v0.1.0"},
        },
    )
    return folder


def xgboost_example(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    mushroom_xgboost().save_model(folder / "mushroom-xgboost.json")
    write_json(folder / "settings.json", SETTINGS)
    write_json(
        folder / "model-settings.json",
        {
            "name": "mushroom-xgboost",
            "implementation": "mlserver_xgboost.XGBoostModel",
            "parameters": {"uri": "./mushroom-xgboost.json", "version": "v0.1.0"},
        },
    )
    return folder


def lightgbm_example(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    iris_lightgbm().save_model(str(folder / "iris-lightgbm.bst"))
    write_json(folder / "settings.json", SETTINGS)
    write_json(
        folder / "model-settings.json",
        {
            "name": "iris-lgb",
            "implementation": "mlserver_lightgbm.LightGBMModel",
            "parameters": {"uri": "./iris-lightgbm.bst", "version": "v0.1.0"},
        },
    )
    return folder


def mms_example(folder: Path) -> Path:
    """docs/examples/mms (and model-repository, which copies its models): models/<name>/ with model files under the
    runtimes' well-known names and settings without a uri."""
    import joblib

    (folder / "models" / "mnist-svm").mkdir(parents=True, exist_ok=True)
    joblib.dump(mnist_svm(), folder / "models" / "mnist-svm" / "model.joblib")
    (folder / "models" / "mushroom-xgboost").mkdir(parents=True, exist_ok=True)
    mushroom_xgboost().save_model(folder / "models" / "mushroom-xgboost" / "model.json")
    write_json(folder / "settings.json", SETTINGS)
    for name, implementation in [
        ("mnist-svm", "mlserver_sklearn.SKLearnModel"),
        ("mushroom-xgboost", "mlserver_xgboost.XGBoostModel"),
    ]:
        write_json(
            folder / "models" / name / "model-settings.json",
            {"name": name, "implementation": implementation, "parameters": {"version": "v0.1.0"}},
        )
    return folder


def random_catboost() -> tuple[Any, np.ndarray]:
    """The catboost example's classifier: 100 rows of 10 random integers, random 0/1 labels, two iterations of depth 2
    (seeded here); and its training rows."""
    from catboost import CatBoostClassifier

    rng = np.random.default_rng(0)
    rows, labels = rng.integers(0, 100, size=(100, 10)), rng.integers(0, 2, size=100)
    model = CatBoostClassifier(  # no catboost_info/ training logs in the working folder
        iterations=2, depth=2, learning_rate=1, loss_function="Logloss", verbose=False, allow_writing_files=False
    )
    return model.fit(rows, labels), rows


def catboost_example(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    random_catboost()[0].save_model(str(folder / "model.cbm"))
    write_json(folder / "settings.json", SETTINGS)
    write_json(
        folder / "model-settings.json",
        {
            "name": "catboost",
            "implementation": "mlserver_catboost.CatboostModel",
            "parameters": {"uri": "./model.cbm", "version": "v0.1.0"},
        },
    )
    return folder
