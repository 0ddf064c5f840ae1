"""Which types named in a ``model.skops`` file load under the default, safe settings.

skops builds only the types it trusts, and its list leaves out much of what fitted estimators hold: the ``Tree`` of
every tree ensemble, HistGradientBoosting's predictors, Gaussian-process kernels, an MLP's optimizer, the score
function of ``SelectKBest``, the ``numpy.mean`` of ``FeatureAgglomeration``. Refusing those refused the most common
tabular models. Building a type runs its own code (``__new__`` and ``__setstate__``), and calling a function runs it,
so trust goes to code the server already runs to serve any estimator, never to code that reads or writes files,
fetches over the network or runs text as code:

- classes of scikit-learn, XGBoost and LightGBM, of SciPy's sparse matrices, splines, spatial trees and distributions,
  numpy's dtypes and random generators, and ``collections.OrderedDict``;
- functions of scikit-learn (score functions, metrics, kernels, its estimators' internals) and numpy's arithmetic and
  reductions by name (``numpy.load``, ``numpy.fromfile`` and the like are not among them); SciPy's special functions
  and its array-API aliases of numpy's;

except anything in the parts of those packages named in :data:`UNTRUSTED_PARTS` (datasets, which read files and
fetch, test helpers, which run scripts, vendored code) and their test packages. A name counts only where the object
it resolves to is defined where the name says (``sklearn.base.np.load`` resolves to ``numpy.load``, defined by
numpy, not scikit-learn: not trusted). Anything else still needs the pickle setting, as a custom transformer does.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where trusted classes and functions are defined (a module and what is under it).
CLASS_MODULES = (
    "sklearn",
    "xgboost",
    "lightgbm",
    "scipy.sparse",
    "scipy.interpolate",
    "scipy.spatial",
    "scipy.stats",
    "numpy.dtypes",
    "numpy.random",
)
FUNCTION_MODULES = ("sklearn", "scipy.special", "scipy._lib.array_api_compat.numpy")
# Trusted by their exact names: a plain container LightGBM's estimators hold, and numpy's dtype.
NAMED_CLASSES = frozenset({"collections.OrderedDict", "numpy.dtype"})
# numpy sets every public function's __module__ to "numpy", numpy.load's as numpy.mean's: these go by name.
NUMPY_FUNCTIONS = frozenset(
    {
        "numpy.abs",
        "numpy.absolute",
        "numpy.add",
        "numpy.amax",
        "numpy.amin",
        "numpy.any",
        "numpy.all",
        "numpy.argmax",
        "numpy.argmin",
        "numpy.around",
        "numpy.asarray",
        "numpy.array",
        "numpy.average",
        "numpy.clip",
        "numpy.cos",
        "numpy.cosh",
        "numpy.cumprod",
        "numpy.cumsum",
        "numpy.divide",
        "numpy.exp",
        "numpy.expm1",
        "numpy.fabs",
        "numpy.floor",
        "numpy.ceil",
        "numpy.log",
        "numpy.log10",
        "numpy.log1p",
        "numpy.log2",
        "numpy.max",
        "numpy.maximum",
        "numpy.mean",
        "numpy.median",
        "numpy.min",
        "numpy.minimum",
        "numpy.multiply",
        "numpy.nanmax",
        "numpy.nanmean",
        "numpy.nanmedian",
        "numpy.nanmin",
        "numpy.nanpercentile",
        "numpy.nanquantile",
        "numpy.nanstd",
        "numpy.nansum",
        "numpy.nanvar",
        "numpy.negative",
        "numpy.percentile",
        "numpy.power",
        "numpy.prod",
        "numpy.ptp",
        "numpy.quantile",
        "numpy.reciprocal",
        "numpy.rint",
        "numpy.round",
        "numpy.sign",
        "numpy.sin",
        "numpy.sinh",
        "numpy.sqrt",
        "numpy.square",
        "numpy.std",
        "numpy.subtract",
        "numpy.sum",
        "numpy.tan",
        "numpy.tanh",
        "numpy.var",
    }
)
UNTRUSTED_PARTS = (
    "sklearn.datasets",
    "sklearn.externals",
    "sklearn.experimental",
    "sklearn.utils._testing",
    "sklearn.utils._mocking",
    "sklearn.utils._show_versions",
    "sklearn.utils.discovery",
    "sklearn.utils.estimator_checks",
    "sklearn.utils.parallel",
    "sklearn.callback",
    "sklearn.conftest",
    "sklearn._build_utils",
    "xgboost.testing",
    "xgboost.tracker",
    "xgboost.collective",
    "xgboost.dask",
    "xgboost.spark",
    "lightgbm.dask",
)
TEST_MODULES = frozenset({"tests", "testing", "conftest", "_testing"})


def is_trusted(name: str) -> bool:
    """Whether the type or function skops names ``name`` (one it does not trust itself) loads without the pickle
    setting."""
    if _untrusted_part(name):
        return False
    class_module = _module_among(name, CLASS_MODULES)
    function_module = _module_among(name, FUNCTION_MODULES)
    by_name = name in NAMED_CLASSES or name in NUMPY_FUNCTIONS
    if class_module is None and function_module is None and not by_name:
        return False  # nothing is imported for a name outside these packages
    target = _resolve(name)
    if target is None:
        return False
    if by_name:  # an exact name, found where it is defined (numpy.mean, not some module's import of it)
        return True
    # Defined where its name says: sklearn.base.np.load is numpy.load, which scikit-learn does not define.
    defined_in = getattr(target, "__module__", None) or ""
    if _untrusted_part(defined_in):
        return False
    if isinstance(target, type):
        return class_module is not None and _within(defined_in, (class_module,))
    return callable(target) and function_module is not None and _within(defined_in, (function_module,))


def _module_among(name: str, modules: tuple[str, ...]) -> str | None:
    return next((module for module in modules if name.startswith(module + ".")), None)


def _within(name: str, parts: tuple[str, ...]) -> bool:
    return any(name == part or name.startswith(part + ".") for part in parts)


def _untrusted_part(name: str) -> bool:
    """In a part never trusted: one of :data:`UNTRUSTED_PARTS`, or a package's own tests."""
    return _within(name, UNTRUSTED_PARTS) or any(part in TEST_MODULES for part in name.split("."))


def _resolve(name: str) -> Any:
    """The object ``name`` (``module.path.Qual.name``) stands for, found as skops finds it; None if there is none."""
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute, None)
            if target is None:
                return None
        return target
    return None
