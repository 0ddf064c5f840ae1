"""The XGBoost platform: ``model.ubj`` (UBJSON) or ``model.json``, as ``save_model`` writes them.

A file saved from a ``Booster`` and one saved from the scikit-learn wrappers are the same format; the objective in
the model says which it is: ``binary:*`` and ``multi:*`` are classifiers, served through ``XGBClassifier``
(predict answers class indices, ``predict_proba`` probabilities), every other objective through ``XGBRegressor``.
So the answers equal the wrappers' ``predict`` and ``Booster.inplace_predict``. The matrix is float32: XGBoost
computes in float32 (a DMatrix holds float32), so a request's numbers are rounded once, as in-process calls round
them.
"""

from __future__ import annotations

import json
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
    model_file,
    module_of,
    refuse_options,
)

FILES = ("model.ubj", "model.json")
EXPORT_FILE = "model.ubj"
# Objectives whose predict_proba XGBClassifier answers (multi:softmax and binary:hinge give classes only).
PROBABILISTIC = ("binary:logistic", "multi:softprob")


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    file = model_file(path, "XGBoost", FILES)
    return TabularServable(name, version, path, describe(read_model(file)))


def read_model(file: Path) -> Any:
    """The model in ``file`` as XGBoost's scikit-learn wrapper for its objective."""
    import xgboost

    booster = xgboost.Booster()
    try:
        booster.load_model(file)
    except xgboost.core.XGBoostError as exc:
        raise ServingError(Code.DATA_LOSS, f"Could not read {file}: {str(exc).splitlines()[0]}") from None
    # One thread per call, as for ONNX: the server runs calls side by side and the batcher merges requests, so
    # XGBoost's default (a thread per core, per call) would oversubscribe the cores under concurrent load.
    kind = xgboost.XGBClassifier if is_classifier(objective(booster)) else xgboost.XGBRegressor
    wrapper = kind(n_jobs=1)
    wrapper.load_model(file)
    return wrapper


def objective(booster: Any) -> str:
    return str(json.loads(booster.save_config())["learner"]["objective"]["name"])


def is_classifier(name: str) -> bool:
    return name.startswith(("binary:", "multi:"))


def describe(model: Any) -> TabularModel:
    booster = model.get_booster()
    names = tuple(booster.feature_names or ())
    matrix = Matrix(np.dtype(np.float32), booster.num_features(), names)
    if not is_classifier(objective(booster)):
        predict = Method(DEFAULT_SIGNATURE, "predictions", np.dtype(np.float32), (-1,), model.predict)
        return TabularModel(matrix, [predict], regress=model.predict, source=model)
    labels = list(range(int(model.n_classes_)))
    methods = [Method(DEFAULT_SIGNATURE, "predictions", np.dtype(np.int64), (-1,), model.predict)]
    proba = model.predict_proba if objective(booster) in PROBABILISTIC else None
    if proba is not None:
        methods.append(Method("predict_proba", "probabilities", np.dtype(np.float32), (-1, len(labels)), proba))
    return TabularModel(matrix, methods, Classes(labels, proba, model.predict), source=model)


# --------------------------------------------------------------------------------------------- export
def exports(obj: Any) -> bool:
    """An XGBoost ``Booster`` or scikit-learn wrapper (``XGBClassifier``, ``XGBRegressor``, ...)."""
    if module_of(obj) != "xgboost" or "xgboost" not in sys.modules:
        return False
    import xgboost

    return isinstance(obj, (xgboost.Booster, xgboost.XGBModel))


def write(obj: Any, folder: Path, **options: Any) -> None:
    """``model.ubj``, with ``save_model`` (the wrappers keep their scikit-learn attributes in it)."""
    refuse_options("XGBoost", options)
    obj.save_model(Path(folder) / EXPORT_FILE)
