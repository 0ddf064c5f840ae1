"""Every estimator scikit-learn ships that fits on the digits exports and serves with the default, safe settings.

Tree ensembles, HistGradientBoosting, Gaussian processes, MLPs, feature selection by a score function: their fitted
state holds types skops does not trust itself (``sklearn.tree._tree.Tree``, ``numpy.mean``, ...), which refused the
most common tabular models unless the server allowed pickles. Each estimator here goes through ``workbench.export``
(which loads what it wrote, as a server does) and is served by the platform's loader with the default policy; its
``serving_default`` answers must equal ``predict`` (``transform`` for a transformer) in-process. The forest and the
gradient boosting also go over REST and gRPC from a server started with default settings.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tabular_models as tm  # (tests/tabular_models.py)
from lightgbm import LGBMClassifier
from sklearn.calibration import CalibratedClassifierCV
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import (
    GradientBoostingClassifier,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
    StackingClassifier,
    VotingClassifier,
)
from sklearn.feature_selection import RFE, SelectFromModel
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.multiclass import OneVsOneClassifier, OneVsRestClassifier, OutputCodeClassifier
from sklearn.pipeline import FeatureUnion, make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.tree import DecisionTreeClassifier
from sklearn.utils import all_estimators
from xgboost import XGBClassifier

import workbench
from workbench import platforms
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms.base import LoadPolicy
from workbench.publishing.export_errors import ExportError

ROWS, ASKED = 300, 40
ITERATIONS = 20
ENSEMBLE_SIZE = 10
# Estimators skops itself cannot write (its UnsupportedTypeException): no safe format holds them.
SKOPS_CANNOT_WRITE = {"Birch"}


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = tm.digits()
    return x[:ROWS], y[:ROWS]


def meta_estimators() -> dict[str, Any]:
    """The estimators that need others to be built: a few of each kind, as people combine them."""
    small_forest = RandomForestClassifier(n_estimators=10, random_state=0)
    linear = LogisticRegression(max_iter=500)
    return {
        "Pipeline(scaler, forest)": make_pipeline(StandardScaler(), small_forest),
        "ColumnTransformer + GradientBoosting": make_pipeline(
            ColumnTransformer([("scaled", StandardScaler(), list(range(32)))], remainder="passthrough"),
            GradientBoostingClassifier(n_estimators=10, random_state=0),
        ),
        "FeatureUnion": make_pipeline(FeatureUnion([("a", StandardScaler()), ("b", FunctionTransformer())]), linear),
        "FunctionTransformer(numpy.log1p)": FunctionTransformer(np.log1p),
        "VotingClassifier": VotingClassifier([("tree", DecisionTreeClassifier(random_state=0)), ("lr", linear)]),
        "StackingClassifier": StackingClassifier(
            [("forest", small_forest), ("hgb", HistGradientBoostingClassifier(max_iter=10))], cv=2
        ),
        "OneVsRestClassifier": OneVsRestClassifier(linear),
        "OneVsOneClassifier": OneVsOneClassifier(DecisionTreeClassifier(random_state=0)),
        "OutputCodeClassifier": OutputCodeClassifier(DecisionTreeClassifier(random_state=0), random_state=0),
        "SelectFromModel(forest)": make_pipeline(SelectFromModel(small_forest), linear),
        "RFE": RFE(linear, n_features_to_select=16, step=16),
        "GridSearchCV(forest)": GridSearchCV(small_forest, {"max_depth": [4, None]}, cv=2),
        "CalibratedClassifierCV(forest)": CalibratedClassifierCV(small_forest, cv=2),
        "Pipeline(scaler, XGBClassifier)": make_pipeline(StandardScaler(), XGBClassifier(n_estimators=5)),
        "Pipeline(scaler, LGBMClassifier)": make_pipeline(StandardScaler(), LGBMClassifier(n_estimators=5, verbose=-1)),
    }


def plain_estimators() -> dict[str, Any]:
    """Every estimator scikit-learn lists that builds without arguments, its work capped: iterations at
    :data:`ITERATIONS`, ensembles at :data:`ENSEMBLE_SIZE` members, dictionaries learnt by coordinate descent (LARS
    took 13 s each for DictionaryLearning and its mini-batch form). This is about what a fit leaves, the types and
    arrays a file holds, not how well it fits."""
    built = {}
    for name, cls in all_estimators():
        try:
            estimator = cls()
        except TypeError:  # a meta-estimator: it needs the estimators it wraps (see meta_estimators)
            continue
        iterations = estimator.get_params().get("max_iter")
        if isinstance(iterations, int) and iterations > ITERATIONS:
            estimator.set_params(max_iter=ITERATIONS)
        if "max_subpopulation" in estimator.get_params():  # TheilSenRegressor: its subsets, not iterations
            estimator.set_params(max_subpopulation=1000)
        members = estimator.get_params().get("n_estimators")
        if isinstance(members, int) and members > ENSEMBLE_SIZE:
            estimator.set_params(n_estimators=ENSEMBLE_SIZE)
        if estimator.get_params().get("fit_algorithm") == "lars":
            estimator.set_params(fit_algorithm="cd")
        built[name] = estimator
    return built


def expected_answer(estimator: Any, x: np.ndarray) -> np.ndarray | None:
    method = getattr(estimator, "predict", None) or getattr(estimator, "transform", None)
    if method is None:
        return None
    value = method(x)
    return np.asarray(value.toarray() if hasattr(value, "toarray") else value)


def served_answer(path: Path, name: str, x: np.ndarray) -> np.ndarray:
    servable = platforms.Loader(LoadPolicy())(name, 1, str(path))  # the default policy: no pickles
    try:
        signature = servable.signatures[DEFAULT_SIGNATURE]
        (output,) = signature.outputs
        return servable.run(signature, {"x": x}, [output])[output]
    finally:
        servable.close()


@pytest.mark.timeout(900)  # 150 estimators fitted, exported and loaded: about a minute alone, 5 on a busy machine
def test_every_estimator_that_fits_on_the_digits_exports_and_serves_safely(tmp_path, digits):
    x, y = digits
    asked = x[:ASKED]
    tried, problems = [], []
    estimators = {**plain_estimators(), **meta_estimators()}
    for name, estimator in estimators.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                estimator.fit(x, y)
                expected = expected_answer(estimator, asked)
            except Exception:  # noqa: BLE001 - it does not take the digits as they come (a FeatureHasher): not listed
                continue
        if expected is None:  # fit_predict only (a clustering of its own training rows): nothing to serve
            continue
        tried.append(name)
        model = "".join(c if c.isalnum() else "_" for c in name)
        if name in SKOPS_CANNOT_WRITE:
            with pytest.raises(ExportError, match="not supported"):
                workbench.export(estimator, model, tmp_path)
            continue
        try:
            result = workbench.export(estimator, model, tmp_path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                served = served_answer(Path(result.path), model, asked)
            if expected.dtype.kind in "fc":
                np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-9)
            else:
                np.testing.assert_array_equal(served.astype(expected.dtype), expected)
        except Exception as exc:  # noqa: BLE001 - every estimator's problem in one report
            problems.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
    assert not problems, "\n".join(problems)
    # The list is scikit-learn's own: most of its estimators fit on the digits, the tree ensembles among them.
    assert len(tried) >= 150, tried
    must = ["RandomForestClassifier", "GradientBoostingClassifier", "HistGradientBoostingClassifier",
            "ExtraTreesRegressor", "MLPClassifier", "GaussianProcessClassifier", "SelectKBest", "StackingClassifier",
            "Pipeline(scaler, XGBClassifier)", "Pipeline(scaler, LGBMClassifier)"]  # fmt: skip
    assert set(must) <= set(tried)


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory, digits):
    x, y = digits
    root = tmp_path_factory.mktemp("ensembles")
    forest = RandomForestClassifier(n_estimators=20, random_state=0).fit(x, y)
    boosting = GradientBoostingClassifier(n_estimators=10, random_state=0).fit(x, y)
    workbench.export(forest, "forest", root)
    workbench.export(boosting, "boosting", root)
    with tm.serving(root) as server:  # default settings: pickles not allowed
        tm.available(server, "forest")
        tm.available(server, "boosting")
        yield server, {"forest": forest, "boosting": boosting}


def test_tree_ensembles_exported_by_default_answer_over_rest_and_grpc(ensembles, digits):
    server, models = ensembles
    x = digits[0][:8]
    with tm.stub_for(server) as stub:
        for name, model in models.items():
            rest = tm.rest_answer(server, name, {"instances": x.tolist()})
            assert rest == {"predictions": model.predict(x).tolist()}
            probabilities = tm.grpc_predict(stub, name, {"x": x}, signature="predict_proba")["probabilities"]
            np.testing.assert_allclose(probabilities, model.predict_proba(x), rtol=1e-12)
