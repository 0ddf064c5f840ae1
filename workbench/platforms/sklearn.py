"""The scikit-learn platform: estimators and pipelines in ``model.skops`` (or, where allowed, a pickle).

``model.skops`` is loaded with skops, which builds only the types it trusts, and those of scikit-learn, XGBoost and
LightGBM that fitted estimators hold (:mod:`workbench.platforms.sklearn_trust`); a file naming other types (a custom
transformer, a third-party estimator) is refused with those types named, unless the server trusts its repository
to run code (the pickle setting: an untrusted type runs its own code when built, as a pickle does).
``model.joblib`` and ``model.pkl`` load only under that setting.

Signatures (see :mod:`workbench.platforms.tabular`): ``serving_default`` is ``predict`` (``transform`` for an
estimator without predict), then ``predict_proba``, ``decision_function`` and ``transform`` where the estimator
has them (a Pipeline has what its last step has), ``classify`` for classifiers and ``regress`` for regressors. The
matrix is float64, the type scikit-learn validates input into, so answers equal ``estimator.predict(X)`` exactly.
An estimator fit on a DataFrame is given a DataFrame with the same columns (a ColumnTransformer selects columns by
name), and requests may send those columns by name.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms.base import PICKLE_SETTING, LoadPolicy
from workbench.platforms.sklearn_trust import is_trusted
from workbench.platforms.tabular import (
    Classes,
    Function,
    Matrix,
    Method,
    TabularModel,
    TabularServable,
    label_dtype,
    model_file,
    module_of,
    refuse_options,
)

SKOPS_FILE = "model.skops"
PICKLE_FILES = ("model.joblib", "model.pkl")
FILES = (SKOPS_FILE, *PICKLE_FILES)
# A pickle by its suffix (MLServer's folders name theirs "mnist-svm.joblib", "model.pickle").
PICKLE_SUFFIXES = (".joblib", ".pkl", ".pickle")

# The methods served as predict signatures, with their output's alias. serving_default is predict's.
OUTPUTS = {
    "predict": "predictions",
    "predict_proba": "probabilities",
    "decision_function": "decision_scores",
    "transform": "transformed",
}
# Packages whose estimators are scikit-learn compatible but served by a platform of their own.
OWN_PLATFORMS = ("xgboost", "lightgbm")


# One version reads at a time. Unpickling imports scikit-learn's modules as the pickle names them, and two load threads
# importing its circular modules at once can find one half-initialised ("cannot import name 'clone' from partially
# initialized module 'sklearn.base'": one start in about eight with two joblib models). Reading is quick beside the
# rest of a server's start.
_READING = threading.Lock()


# scikit-learn's copies of the array-API namespaces of other frameworks. Each imports its framework (PyTorch: seconds),
# and scikit-learn uses one only when array-API dispatch is on and it is given that framework's arrays.
ARRAY_API_FRAMEWORKS = tuple(
    f"sklearn.externals.array_api_compat.{framework}" for framework in ("torch", "cupy", "dask")
)
_IMPORTING = threading.Lock()

# skops consults its table of trusted scikit-learn estimators only in a load given no list of trusted types, and
# workbench's loads always give one: every type skops does not trust itself, each checked against workbench's own
# policy (:func:`is_trusted`), which trusts every estimator of that table (a unit test checks it). Building the table
# imports every module of scikit-learn (``all_estimators`` walks them): over half of a first load of a small model.
# A process that only serves (:func:`serving_process`) imports skops without it; a notebook's kernel builds it, as
# importing skops always does, since the user's own ``skops.io.load`` may rely on it.
_BUILD_SKOPS_TABLE = True


def serving_process() -> None:
    """Say that this process only serves (``workbench serve``, its workers and runners): skops, when it is imported,
    builds no table of the scikit-learn estimators it trusts, which no load here consults."""
    global _BUILD_SKOPS_TABLE
    _BUILD_SKOPS_TABLE = False


def _no_estimators(type_filter: Any = None) -> list[tuple[str, type]]:
    """``sklearn.utils.all_estimators`` while skops is imported in a serving process: it lists none."""
    return []


def import_skops() -> ModuleType:
    """``skops.io``, imported without importing PyTorch (or CuPy, or Dask) on the way.

    Importing ``skops.io`` builds its table of trusted types, which lists every scikit-learn estimator
    (``sklearn.utils.all_estimators``): that walks scikit-learn's packages with :func:`pkgutil.walk_packages`, which
    imports each package it goes into, ``sklearn.externals.array_api_compat.torch`` among them, and that one imports
    PyTorch wherever PyTorch is installed. The estimators are not there (``all_estimators`` skips
    ``sklearn.externals``), so those packages are marked unimportable (None in ``sys.modules``, which the walk
    passes over) while skops is imported, and unmarked after it (an import of one of them elsewhere in the process
    fails in that moment only, as one of a framework not installed would). The table skops builds is the one it
    always builds; once skops is imported, this is ``import skops.io``.
    """
    with _IMPORTING:
        first = "skops.io" not in sys.modules
        blocked = [name for name in ARRAY_API_FRAMEWORKS if first and name not in sys.modules]
        for name in blocked:
            sys.modules[name] = None  # type: ignore[assignment]
        walk: Callable[..., Any] | None = None
        if first and not _BUILD_SKOPS_TABLE:
            import sklearn.utils

            walk, sklearn.utils.all_estimators = sklearn.utils.all_estimators, _no_estimators
        try:
            import skops.io
        finally:
            if walk is not None:
                sklearn.utils.all_estimators = walk
            for name in blocked:
                if name in sys.modules and sys.modules[name] is None:
                    del sys.modules[name]
    return skops.io


def warm_up() -> None:
    """Import skops ahead of a measured load (:meth:`workbench.platforms.Platform.import_framework`)."""
    import_skops()


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    with _READING:
        estimator = read_estimator(model_file(path, "scikit-learn", FILES), policy)
        model = describe(estimator)
    return TabularServable(name, version, path, model)


# --------------------------------------------------------------------------------------------- reading
def read_estimator(file: Path, policy: LoadPolicy) -> Any:
    if file.suffix in PICKLE_SUFFIXES:
        if not policy.allow_pickle:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{file} is a pickle, which runs code when it is loaded; pickles load only when the server allows "
                f"them: {PICKLE_SETTING}. Or export the model as {SKOPS_FILE} (workbench.export writes one)",
            )
        estimator = _unpickle(file)
    else:
        estimator = _read_skops(file, policy)
    if not any(hasattr(estimator, m) for m in ("predict", "transform")):
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{file} holds a {type(estimator).__name__}, which has neither predict nor transform",
        )
    return estimator


def _read_skops(file: Path, policy: LoadPolicy) -> Any:
    skops_io = import_skops()
    try:
        named = skops_io.get_untrusted_types(file=file)  # those skops does not trust itself
        refused = [] if policy.allow_pickle else [name for name in named if not is_trusted(name)]
        if refused:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{file} holds types neither skops nor workbench trusts: {', '.join(refused)}. Building them runs "
                f"their code, as loading a pickle does, so they load only when the server allows pickles: "
                f"{PICKLE_SETTING}. Or export a model made of the types of scikit-learn, XGBoost and LightGBM",
            )
        return skops_io.load(file, trusted=named or None)
    except ServingError:
        raise
    except Exception as exc:  # noqa: BLE001 - a truncated zip, a file of another skops version
        raise ServingError(Code.DATA_LOSS, f"Could not read {file}: {type(exc).__name__}: {exc}") from None


def _unpickle(file: Path) -> Any:
    try:
        if file.suffix == ".joblib":
            import joblib

            return joblib.load(file)
        import pickle

        with file.open("rb") as f:
            return pickle.load(f)  # noqa: S301 - allowed by the server's pickle setting
    except Exception as exc:  # noqa: BLE001 - a missing class, a truncated file
        raise ServingError(Code.DATA_LOSS, f"Could not unpickle {file}: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------------------------- signatures
def describe(estimator: Any) -> TabularModel:
    """The estimator's methods as a tabular model: what each returns, learnt by calling it on one row of zeros."""
    from sklearn.base import is_classifier, is_regressor

    names = tuple(str(n) for n in getattr(estimator, "feature_names_in_", ()))
    width = getattr(estimator, "n_features_in_", None)
    matrix = Matrix(np.dtype(np.float64), int(width) if width is not None else None, names)
    frame = _as_frame(names)
    labels = getattr(estimator, "classes_", None)
    single_output_classifier = is_classifier(estimator) and isinstance(labels, np.ndarray) and labels.ndim == 1

    methods = []
    for method, output in OUTPUTS.items():
        if not hasattr(estimator, method):
            continue
        fn = _calling(getattr(estimator, method), frame)
        dtype, shape = _probe(fn, matrix)
        if dtype is None:  # the estimator does not take a row of zeros: declare what it is known to return
            classifier_labels = method == "predict" and single_output_classifier
            dtype = label_dtype(labels) if classifier_labels and labels is not None else np.dtype(np.float64)
        signature = DEFAULT_SIGNATURE if method == "predict" else method
        methods.append(Method(signature, output, dtype, shape, fn))
    if not any(m.signature == DEFAULT_SIGNATURE for m in methods):  # a transformer: transform is its default
        transform = next(m for m in methods if m.signature == "transform")
        methods.insert(0, Method(DEFAULT_SIGNATURE, transform.output, transform.dtype, transform.shape, transform.fn))

    classes = regress = None
    if single_output_classifier and hasattr(estimator, "predict"):
        assert labels is not None
        proba = _calling(estimator.predict_proba, frame) if hasattr(estimator, "predict_proba") else None
        classes = Classes(list(labels), proba, _calling(estimator.predict, frame))
    elif is_regressor(estimator) and hasattr(estimator, "predict"):
        regress = _calling(estimator.predict, frame)
    return TabularModel(matrix, methods, classes, regress, source=estimator)


def _as_frame(names: tuple[str, ...]) -> Callable[[np.ndarray], Any] | None:
    """How rows reach an estimator fit on a DataFrame: as a DataFrame with its columns (None: as the matrix)."""
    if not names:
        return None
    try:
        import pandas as pd
    except ImportError:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            "This estimator was fit on a DataFrame (it has feature_names_in_), and serving it needs pandas; "
            "install it with: pip install 'workbench-serving[sklearn]'",
        ) from None
    columns = list(names)
    # Copied as pandas copies an array by default (a block per dtype, each column contiguous), so the estimator's
    # arithmetic sees the layout ``pd.DataFrame(X, columns=...)`` gives in-process, and the same last bits.
    return lambda rows: pd.DataFrame(rows, columns=columns)


def _calling(method: Callable[[Any], Any], frame: Callable[[np.ndarray], Any] | None) -> Function:
    if frame is None:
        return method
    return lambda rows: method(frame(rows))


def _probe(fn: Function, matrix: Matrix) -> tuple[np.dtype[Any] | None, tuple[int, ...] | None]:
    """The dtype and shape ``fn`` answers in, from one row of zeros; (None, None) when it refuses that row."""
    if matrix.width is None:
        return None, None
    try:
        with warnings.catch_warnings():  # a log of zero, a convergence note: the probe's answer is not used
            warnings.simplefilter("ignore")
            value = fn(np.zeros((1, matrix.width), dtype=matrix.dtype))
        if hasattr(value, "toarray"):
            value = value.toarray()
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - e.g. an encoder that has not seen the category 0
        return None, None
    if array.ndim == 0 or array.dtype.kind not in "biufcOSU":
        return None, None
    return label_dtype(array), (-1, *array.shape[1:])


# --------------------------------------------------------------------------------------------- export
def exports(obj: Any) -> bool:
    """Whether ``obj`` is a scikit-learn estimator or pipeline (XGBoost and LightGBM have platforms of their own)."""
    if module_of(obj) in OWN_PLATFORMS:
        return False
    if module_of(obj) == "sklearn":
        return True
    if "sklearn" not in sys.modules:  # not imported: obj cannot be an estimator derived from scikit-learn's
        return False
    from sklearn.base import BaseEstimator

    return isinstance(obj, BaseEstimator)


def write(obj: Any, folder: Path, **options: Any) -> None:
    """``model.skops``, written with skops (a fitted estimator; it loads back without pickle)."""
    refuse_options("scikit-learn", options)
    import_skops().dump(obj, Path(folder) / SKOPS_FILE)
