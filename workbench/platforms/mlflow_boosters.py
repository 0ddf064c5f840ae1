"""A ``Booster`` logged by MLflow's ``xgboost`` or ``lightgbm`` flavor, answering as ``mlflow models serve`` does.

MLflow's pyfunc answers a booster's own ``predict``: for a classifier, its values (a multiclass booster's
probabilities, one column per class; a binary one's probability of the second class), not the classes that
workbench's XGBoost and LightGBM platforms answer for the scikit-learn wrappers. So a version whose ``MLmodel``
names a booster (``model_class: xgboost.core.Booster``, ``lightgbm.basic.Booster``) answers ``serving_default``
with ``booster.predict``, in the type the library computes in, with no pyfunc per call. The files are the
libraries' own formats (XGBoost's ``model.ubj``/``model.json``, LightGBM's text ``model.lgb``), never a pickle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms.base import LoadPolicy
from workbench.platforms.tabular import Matrix, Method, TabularModel, TabularServable, model_file

XGBOOST_FILES = ("model.ubj", "model.json")
LIGHTGBM_FILES = ("model.lgb",)


def load_xgboost(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    import xgboost

    file = model_file(path, "XGBoost", XGBOOST_FILES)
    booster = xgboost.Booster()
    try:
        booster.load_model(file)
    except xgboost.core.XGBoostError as exc:
        raise ServingError(Code.DATA_LOSS, f"Could not read {file}: {str(exc).splitlines()[0]}") from None
    # One thread per call, as the XGBoost platform's: the server runs calls side by side and batches requests.
    booster.set_param({"nthread": 1})

    def predict(rows: np.ndarray) -> np.ndarray:
        # Through a DMatrix, as MLflow's wrapper calls it (so the same float32 rounding of the same rows).
        return np.asarray(booster.predict(xgboost.DMatrix(rows, nthread=1)))

    matrix = Matrix(np.dtype(np.float32), booster.num_features(), tuple(booster.feature_names or ()))
    return TabularServable(name, version, path, _described(matrix, predict, booster))


def load_lightgbm(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    import functools

    from workbench.platforms.lightgbm import read_booster

    booster = read_booster(model_file(path, "LightGBM", LIGHTGBM_FILES))  # the text format, as model.txt
    names = tuple(booster.feature_name())
    if names == tuple(f"Column_{i}" for i in range(len(names))):  # LightGBM's names for unnamed columns
        names = ()
    matrix = Matrix(np.dtype(np.float64), booster.num_feature(), names)
    predict = functools.partial(booster.predict, num_threads=1)  # one thread a call, as the LightGBM platform's
    return TabularServable(name, version, path, _described(matrix, predict, booster))


def _described(matrix: Matrix, predict: Callable[[np.ndarray], np.ndarray], booster: Any) -> TabularModel:
    """``serving_default``: the booster's values, shaped as it answers one row of zeros (the objective decides: one
    value per row, or a column per class or target)."""
    probe = np.asarray(predict(np.zeros((1, matrix.width or 0), dtype=matrix.dtype)))
    shape = (-1, *probe.shape[1:])
    method = Method(DEFAULT_SIGNATURE, "predictions", probe.dtype, shape, predict)
    return TabularModel(matrix, [method], source=booster)
