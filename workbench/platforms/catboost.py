"""The CatBoost platform: ``model.cbm``, CatBoost's own format (``model.save_model("model.cbm")``).

The loss function written in the model says what it is: ``Logloss``, ``CrossEntropy``, ``MultiClass`` and
``MultiClassOneVsAll`` are classifiers, answered as ``CatBoostClassifier`` answers (predict: the most probable of the
class labels the file keeps; ``predict_proba``: one column per class, binary models included); every other loss is a
regressor (predict: the model's values). The matrix is float32, the type CatBoost turns every feature into, so
answers equal in-process ones. Categorical and text features need columns of strings, which a tabular matrix is not:
such a model is refused at load, naming them.

``workbench.export`` writes a CatBoost model (``CatBoostClassifier``, ``CatBoostRegressor``, or a plain ``CatBoost``)
as ``model.cbm`` with its own ``save_model``: the file keeps the loss, the class labels and the feature names, so
the served version answers as the object does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms.base import LoadPolicy
from workbench.platforms.tabular import (
    Classes,
    Matrix,
    Method,
    TabularModel,
    TabularServable,
    label_dtype,
    model_file,
    module_of,
    refuse_options,
)

FILE = "model.cbm"
CLASSIFIER_LOSSES = ("Logloss", "CrossEntropy", "MultiClass", "MultiClassOneVsAll")


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    model = read_model(model_file(path, "CatBoost", (FILE,)))
    return TabularServable(name, version, path, describe(model))


def read_model(file: Path) -> Any:
    """The model in ``file``, as a ``CatBoostClassifier`` for a classifier's loss (it keeps the class labels) and a
    ``CatBoostRegressor`` otherwise; DATA_LOSS where the file is not CatBoost's."""
    import catboost

    try:
        model: Any = catboost.CatBoost()
        model.load_model(str(file))
    except catboost.CatBoostError as exc:
        raise ServingError(Code.DATA_LOSS, f"Could not read {file}: {str(exc).splitlines()[0]}") from None
    typed = catboost.CatBoostClassifier() if is_classifier(model) else catboost.CatBoostRegressor()
    typed.load_model(str(file))
    categorical = [*typed.get_cat_feature_indices(), *typed.get_text_feature_indices()]
    if categorical:
        names = [typed.feature_names_[i] for i in categorical]
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{file}: categorical and text features ({', '.join(names)}) are not served; only numeric features are",
        )
    return typed


def loss(model: Any) -> str:
    """The model's loss function's name: "MultiClass" of "MultiClass:use_weights=false"."""
    return str(model.get_all_params().get("loss_function", "")).split(":")[0]


def is_classifier(model: Any) -> bool:
    return loss(model) in CLASSIFIER_LOSSES


def features(model: Any) -> tuple[str, ...]:
    """The features' names, where the model was fit on named ones (CatBoost names unnamed ones "0", "1"...)."""
    names = tuple(str(n) for n in (model.feature_names_ or ()))
    return () if names == tuple(str(i) for i in range(len(names))) else names


def describe(model: Any) -> TabularModel:
    matrix = Matrix(np.dtype(np.float32), len(model.feature_names_ or ()) or None, features(model))
    # One thread per call (as for LightGBM and XGBoost): the server runs calls side by side and the batcher merges
    # requests; CatBoost's default, a thread per core for every call, would oversubscribe the cores.
    if not is_classifier(model):

        def values(rows: np.ndarray) -> np.ndarray:
            return np.asarray(model.predict(rows, thread_count=1), dtype=np.float64)

        predictions = Method(DEFAULT_SIGNATURE, "predictions", np.dtype(np.float64), (-1,), values)
        return TabularModel(matrix, [predictions], regress=values, source=model)

    labels = list(np.asarray(model.classes_).tolist())
    table = np.asarray(labels)

    def probabilities(rows: np.ndarray) -> np.ndarray:
        return np.asarray(model.predict_proba(rows, thread_count=1), dtype=np.float64)

    def predict(rows: np.ndarray) -> np.ndarray:
        return table[np.argmax(probabilities(rows), axis=1)]

    methods = [
        Method(DEFAULT_SIGNATURE, "predictions", label_dtype(table), (-1,), predict),
        Method("predict_proba", "probabilities", np.dtype(np.float64), (-1, len(labels)), probabilities),
    ]
    return TabularModel(matrix, methods, Classes(labels, probabilities, predict), source=model)


# --------------------------------------------------------------------------------------------- export
def exports(obj: Any) -> bool:
    """A CatBoost model (``CatBoostClassifier``, ``CatBoostRegressor``, ``CatBoostRanker``, ``CatBoost``)."""
    if module_of(obj) != "catboost" or "catboost" not in sys.modules:
        return False
    import catboost

    return isinstance(obj, catboost.CatBoost)


def write(obj: Any, folder: Path, **options: Any) -> None:
    """``model.cbm``, CatBoost's own format, with ``save_model``."""
    refuse_options("CatBoost", options)
    obj.save_model(str(Path(folder) / FILE))
