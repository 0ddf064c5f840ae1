"""SHAP values with the ``shap`` library: TreeExplainer, LinearExplainer and KernelExplainer.

Why ``shap`` rather than each library's own contributions (XGBoost's ``pred_contribs``, LightGBM's ``pred_contrib``):
those cover two libraries, while scikit-learn's forests and gradient boosting, its linear models and any other model
need shap's algorithms anyway; one implementation answers every tabular model alike (the same expected values, the
same layouts), and its TreeExplainer reads XGBoost and LightGBM models exactly (it is the same TreeSHAP).
``shap`` is imported on the first explanation, never by a server that explains nothing.

- TreeExplainer (trees and boosting: scikit-learn's, XGBoost's, LightGBM's) is exact and needs no background
  (``tree_path_dependent``: the trees' own cover); it explains the model's raw output: log-odds for gradient
  boosting classifiers, probabilities for random forests, the prediction for regressors.
- LinearExplainer (scikit-learn's linear models) is exact given a background (its mean is the reference); it
  explains the decision function: log-odds for a logistic regression.
- KernelExplainer is the fallback for anything with one numeric matrix input (a Pipeline, an SVM, an ONNX model):
  model-agnostic and approximate, it runs the model on ``nsamples`` × background rows per explained row, so its
  sampling is scaled to the time the request has left (see :func:`kernel`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.protocol.attributions import Budget, as_columns

log = logging.getLogger(__name__)

MAX_BACKGROUND = 100  # rows of background KernelExplainer runs the model on per sample (a sample of it if more)
MIN_KERNEL_SAMPLES = 16  # below this KernelExplainer's estimate is noise: refuse rather than answer it

# A fitted explainer per model object (building TreeExplainer walks every tree): dropped with the model.
_EXPLAINERS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_EXPLAINERS_LOCK = threading.Lock()

# Stacked SHAP values [n, features, k] and expected values [k].
Shapley = tuple[np.ndarray, np.ndarray]


def import_shap() -> Any:
    try:
        import shap
    except ImportError:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            "SHAP explanations need the shap package, which is not installed: pip install 'workbench-serving[explain]'",
        ) from None
    return shap


def _cached(model: Any, kind: str, build: Callable[[], Any]) -> Any:
    try:
        with _EXPLAINERS_LOCK:
            found = _EXPLAINERS.setdefault(model, {}).get(kind)
    except TypeError:  # a model object that takes no weak references: built each time
        return build()
    if found is None:
        found = build()
        with _EXPLAINERS_LOCK:
            _EXPLAINERS[model][kind] = found
    return found


def tree_explainer(model: Any) -> Any | None:
    """shap's TreeExplainer of ``model``, or None when shap does not read it as trees."""
    shap = import_shap()

    def build() -> Any:
        try:
            return shap.TreeExplainer(model)
        except Exception as exc:  # noqa: BLE001 - shap's InvalidModelError and the libraries' own refusals
            log.debug("TreeExplainer does not take a %s: %s", type(model).__name__, exc)
            return False

    explainer = _cached(model, "tree", build)
    return explainer or None


def is_linear(model: Any) -> bool:
    """A scikit-learn linear model: coefficients and an intercept LinearExplainer can read."""
    return type(model).__module__.startswith("sklearn.linear_model") and hasattr(model, "coef_")


def tree(explainer: Any, rows: np.ndarray) -> Shapley:
    # check_additivity would raise on float32 round-off in XGBoost models; the answer reports value and base
    # value, and the tests check additivity against the model itself.
    values = explainer.shap_values(rows, check_additivity=False)
    return _stacked(values, explainer.expected_value, len(rows))


def linear(model: Any, background: np.ndarray, rows: np.ndarray) -> Shapley:
    shap = import_shap()
    # One per model object: its version's background is read once (workbench.explain.explaining) and never changes.
    explainer = _cached(model, "linear", lambda: shap.LinearExplainer(model, background))
    return _stacked(explainer.shap_values(rows), explainer.expected_value, len(rows))


def kernel(
    predict: Callable[[np.ndarray], np.ndarray],
    background: np.ndarray,
    rows: np.ndarray,
    budget: Budget,
    nsamples: int | None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """KernelExplainer's values [n, features, k], expected values [k], and the samples it took per row.

    Each sample runs ``predict`` on every background row, so a row costs about ``nsamples`` × one run on the
    background. That cost is measured once, and the samples are the fewest of what was asked (shap's default:
    2 × features + 2048) and what fits half the time left per row; the other half is the margin for the solver
    and the estimate's error. When even a usable minimum does not fit, the answer is DEADLINE_EXCEEDED at once.
    """
    if len(background) > MAX_BACKGROUND:  # a fixed sample: the same request gets the same answer
        background = background[np.random.default_rng(0).choice(len(background), MAX_BACKGROUND, replace=False)]
    started = time.monotonic()
    predict(background)  # one sample's cost: the model on every background row
    per_sample = max(time.monotonic() - started, 1e-5)
    features = rows.shape[1]
    wanted = nsamples if nsamples is not None else 2 * features + 2048
    explainer: Any = None
    values, used = [], wanted
    for i in range(len(rows)):
        budget.check(f"row {i} of {len(rows)}")
        fits = int(budget.left() / (len(rows) - i) / 2 / per_sample)
        used = min(wanted, fits)
        if used < MIN_KERNEL_SAMPLES:
            raise ServingError(
                Code.DEADLINE_EXCEEDED,
                f"KernelExplainer needs at least {MIN_KERNEL_SAMPLES} samples per row, each running the model on "
                f"{len(background)} background rows (about {per_sample * 1000:.1f} ms a sample); the "
                f"{budget.left():.2f} s left fit {max(fits, 0)} for each of {len(rows) - i} row(s): send fewer rows, "
                "export a smaller background, or allow the request longer",
            )
        if explainer is None:  # shap is imported once the work is known to fit
            explainer = import_shap().KernelExplainer(lambda x: as_columns(predict(x)), background)
        one = explainer.shap_values(rows[i : i + 1], nsamples=used, silent=True)
        values.append(_stacked(one, explainer.expected_value, 1)[0])
    expected = np.asarray(explainer.expected_value, dtype=np.float64).reshape(-1)
    return np.concatenate(values), expected, used


def _stacked(values: Any, expected: Any, n: int) -> Shapley:
    """shap's answer in one layout: [n, features, k] and [k] (shap gives a list per output in older versions,
    [n, features] for one output, [n, features, k] for several)."""
    if isinstance(values, list):
        array = np.stack([np.asarray(v, dtype=np.float64) for v in values], axis=-1)
    else:
        array = np.asarray(values, dtype=np.float64)
        if array.ndim == 2:
            array = array[..., np.newaxis]
    base = np.asarray(expected, dtype=np.float64).reshape(-1)
    if base.shape[0] != array.shape[-1]:  # one expected value for several outputs: shared
        base = np.broadcast_to(base[:1], (array.shape[-1],)).copy()
    return array.reshape(n, -1, array.shape[-1]), base
