"""The LightGBM platform: ``model.txt``, LightGBM's text format (``Booster.save_model``).

The objective written in the model says what it is: ``binary``, ``multiclass`` and ``multiclassova`` are
classifiers, answered as ``LGBMClassifier`` answers (predict: the most probable class; ``predict_proba``: one
column per class, binary models included); every other objective is a regressor (predict: the booster's values).
The text format keeps no class labels: a classifier's classes are 0..k-1 unless ``workbench.json`` lists them
(``{"platform": "lightgbm", "classes": ["cat", "dog"]}``; :func:`write` does so for an ``LGBMClassifier`` fit on
other labels). The matrix is float64, the type LightGBM predicts in, so answers equal in-process ones exactly.
"""

from __future__ import annotations

import functools
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
    version_config,
    write_version_config,
)

FILE = "model.txt"
CLASSIFIER_OBJECTIVES = ("binary", "multiclass", "multiclassova")


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    file = model_file(path, "LightGBM", (FILE,))
    booster = read_booster(file)
    return TabularServable(name, version, path, describe(booster, version_config(Path(path)).get("classes")))


def read_booster(file: Path) -> Any:
    import lightgbm

    try:
        return lightgbm.Booster(model_file=str(file))
    except lightgbm.basic.LightGBMError as exc:
        raise ServingError(Code.DATA_LOSS, f"Could not read {file}: {exc}") from None


def objective(booster: Any) -> str:
    """The model's objective's name: "multiclass" of "multiclass num_class:10"."""
    return str(booster.dump_model(num_iteration=0)["objective"]).split()[0]


def describe(booster: Any, labels: list[Any] | None = None) -> TabularModel:
    names = tuple(booster.feature_name())
    if names == tuple(f"Column_{i}" for i in range(len(names))):  # LightGBM's names for unnamed columns
        names = ()
    matrix = Matrix(np.dtype(np.float64), booster.num_feature(), names)
    # One thread per call (as for ONNX and XGBoost): the server runs calls side by side and the batcher merges
    # requests; LightGBM's default, a thread per core for every call, would oversubscribe the cores.
    run = functools.partial(booster.predict, num_threads=1)
    if objective(booster) not in CLASSIFIER_OBJECTIVES:
        values = Method(DEFAULT_SIGNATURE, "predictions", np.dtype(np.float64), (-1,), run)
        return TabularModel(matrix, [values], regress=run, source=booster)

    k = 2 if objective(booster) == "binary" else booster.num_model_per_iteration()
    if labels is None:
        labels = list(range(k))
    elif not isinstance(labels, list) or len(labels) != k:
        raise ServingError(
            Code.FAILED_PRECONDITION, f"workbench.json's \"classes\" must list the model's {k} classes in order"
        )
    table = np.asarray(labels)

    def probabilities(rows: np.ndarray) -> np.ndarray:
        values = run(rows)
        return np.vstack((1.0 - values, values)).T if values.ndim == 1 else values  # LGBMClassifier's

    def predict(rows: np.ndarray) -> np.ndarray:
        return table[np.argmax(probabilities(rows), axis=1)]

    methods = [
        Method(DEFAULT_SIGNATURE, "predictions", label_dtype(table), (-1,), predict),
        Method("predict_proba", "probabilities", np.dtype(np.float64), (-1, k), probabilities),
    ]
    return TabularModel(matrix, methods, Classes(labels, probabilities, predict), source=booster)


# --------------------------------------------------------------------------------------------- export
def exports(obj: Any) -> bool:
    """A LightGBM ``Booster`` or scikit-learn estimator (``LGBMClassifier``, ``LGBMRegressor``, ...)."""
    if module_of(obj) != "lightgbm" or "lightgbm" not in sys.modules:
        return False
    import lightgbm

    return isinstance(obj, (lightgbm.Booster, lightgbm.LGBMModel))


def write(obj: Any, folder: Path, **options: Any) -> None:
    """``model.txt``, and the classes in ``workbench.json`` for a classifier fit on labels other than 0..k-1."""
    refuse_options("LightGBM", options)
    import lightgbm

    booster = obj if isinstance(obj, lightgbm.Booster) else obj.booster_
    booster.save_model(str(Path(folder) / FILE))
    if isinstance(obj, lightgbm.LGBMClassifier):
        labels = np.asarray(obj.classes_)
        if not np.array_equal(labels, np.arange(len(labels))):
            write_version_config(Path(folder), "lightgbm", classes=labels.tolist())
