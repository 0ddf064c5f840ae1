"""Drift statistics: per feature, served inputs against a reference, with open tests (PSI, Kolmogorov–Smirnov, chi²).

A request's inputs become features by column: a 1-D input is one feature (``x``), a 2-D input of up to
``MAX_COLUMNS`` columns is one feature per column (``x[0]``, ``x[1]`` …); inputs of higher rank (images,
sequences) are not tested. A feature is *categorical* when it holds strings or booleans, or whole numbers with at
most ``MAX_CATEGORIES`` distinct values in the reference; otherwise *numeric*.

- Population stability index (both kinds): the reference's deciles (numeric) or categories as bins,
  ``Σ (w - r) · ln(w / r)`` over the bins' shares, each share at least ``1e-4``. By convention below 0.1 is stable,
  0.1–0.25 a moderate shift, above 0.25 a large one.
- Numeric: the two-sample Kolmogorov–Smirnov test (``scipy.stats.ks_2samp``): statistic and p-value.
- Categorical: Pearson's chi-squared test of the 2×k table of reference and window counts
  (``scipy.stats.chi2_contingency``).

A feature *drifts* when its PSI reaches the ``psi`` threshold or its test's p-value falls below ``p_value``
(:class:`Thresholds`, ``--drift_thresholds``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError

MAX_COLUMNS = 64  # a wider input (an embedding, pixels) is not a set of features to test one by one
MAX_CATEGORIES = 20
PSI_BINS = 10
_MIN_SHARE = 1e-4
NUMERIC, CATEGORICAL = "numeric", "categorical"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When a feature drifts: PSI at least ``psi``, or p-value below ``p_value`` (None: that rule is off)."""

    psi: float | None = 0.2
    p_value: float | None = 0.001

    def drifted(self, psi: float, p_value: float | None) -> bool:
        if self.psi is not None and psi >= self.psi:
            return True
        return self.p_value is not None and p_value is not None and p_value < self.p_value

    def as_dict(self) -> dict[str, float | None]:
        return {"psi": self.psi, "p_value": self.p_value}


def parse_thresholds(text: str) -> Thresholds:
    """``psi=0.2,p_value=0.001``; a rule left out is off (``psi=0.25`` alone: PSI only)."""
    values: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("psi", "p_value"):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"--drift_thresholds: {part!r} is not psi=NUMBER or p_value=NUMBER (e.g. psi=0.2,p_value=0.001)",
            )
        try:
            number = float(value)
        except ValueError:
            raise ServingError(Code.INVALID_ARGUMENT, f"--drift_thresholds: {key}={value!r} is not a number") from None
        if not math.isfinite(number) or number <= 0 or (key == "p_value" and number >= 1):
            bound = "from 0 to 1 (exclusive)" if key == "p_value" else "above 0"
            raise ServingError(Code.INVALID_ARGUMENT, f"--drift_thresholds: {key} must be {bound}, got {value}")
        values[key] = number
    if not values:
        raise ServingError(Code.INVALID_ARGUMENT, "--drift_thresholds names no threshold (psi=…, p_value=…)")
    return Thresholds(psi=values.get("psi"), p_value=values.get("p_value"))


def features(inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A batch of inputs (alias → array, rows first) as feature columns, one value per row."""
    out: dict[str, np.ndarray] = {}
    for alias, value in inputs.items():
        array = np.asarray(value)
        if array.ndim == 1:
            out[alias] = array
        elif array.ndim == 2 and array.shape[1] <= MAX_COLUMNS:
            for column in range(array.shape[1]):
                out[f"{alias}[{column}]"] = array[:, column]
    return out


def kind_of(reference: np.ndarray) -> str:
    """Categorical: strings, booleans, or at most :data:`MAX_CATEGORIES` distinct whole numbers (a code, a count,
    an image's grey levels: integers in a float matrix are what scikit-learn models are fed); else numeric."""
    if reference.dtype.kind in "OSUb":
        return CATEGORICAL
    if reference.dtype.kind in "iuf":
        distinct = np.unique(reference)
        whole = reference.dtype.kind != "f" or bool(np.all(np.isfinite(distinct) & (distinct == np.round(distinct))))
        if whole and len(distinct) <= MAX_CATEGORIES:
            return CATEGORICAL
    return NUMERIC


def categories(values: np.ndarray) -> np.ndarray:
    """Categorical values as comparable keys: bytes and str alike, numbers as they are."""
    if values.dtype.kind == "O":
        return np.array([v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values], object)
    if values.dtype.kind == "S":
        return values.astype(str).astype(object)
    return values


@dataclasses.dataclass(frozen=True)
class FeatureDrift:
    name: str
    kind: str
    psi: float
    test: str  # "ks" or "chi2"
    statistic: float
    p_value: float
    drifted: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare(name: str, kind: str, reference: np.ndarray, window: np.ndarray, thresholds: Thresholds) -> FeatureDrift:
    """One feature's window against its reference."""
    from scipy import stats

    if kind == NUMERIC:
        ref = reference.astype(np.float64)
        win = window.astype(np.float64)
        ref, win = ref[np.isfinite(ref)], win[np.isfinite(win)]
        psi = numeric_psi(ref, win)
        result = stats.ks_2samp(ref, win)
        statistic, p_value, test = float(result.statistic), float(result.pvalue), "ks"
    else:
        ref, win = categories(reference).astype(str), categories(window).astype(str)
        names, codes = np.unique(np.concatenate([ref, win]), return_inverse=True)
        ref_counts = np.bincount(codes[: len(ref)], minlength=len(names)).astype(np.float64)
        win_counts = np.bincount(codes[len(ref) :], minlength=len(names)).astype(np.float64)
        psi = _psi(ref_counts, win_counts)
        if len(names) < 2:
            statistic, p_value = 0.0, 1.0
        else:
            result = stats.chi2_contingency(np.stack([ref_counts, win_counts]))
            statistic, p_value = float(result.statistic), float(result.pvalue)
        test = "chi2"
    return FeatureDrift(name, kind, psi, test, statistic, p_value, thresholds.drifted(psi, p_value))


def numeric_psi(reference: np.ndarray, window: np.ndarray) -> float:
    """PSI over the reference's deciles (fewer where values repeat), open at both ends. Each edge is a bin of its
    own too (values equal to it), between the bins below and above it: a value the reference holds often (a pixel
    nearly always 0, a clipped maximum) is one decile after another, and would otherwise share its bin with every
    value on one side of it, so a window moving off it would show no drift."""
    if len(reference) == 0 or len(window) == 0:
        return 0.0
    edges = np.unique(np.quantile(reference, np.linspace(0, 1, PSI_BINS + 1))[1:-1])

    def counts(values: np.ndarray) -> np.ndarray:
        # Below edge i: 2i; equal to edge i: 2i + 1; above the last edge: 2 * len(edges).
        bins = np.searchsorted(edges, values, side="left") + np.searchsorted(edges, values, side="right")
        return np.bincount(bins, minlength=2 * len(edges) + 1).astype(np.float64)

    return _psi(counts(reference), counts(window))


def _psi(ref_counts: np.ndarray, win_counts: np.ndarray) -> float:
    r = np.maximum(ref_counts / max(ref_counts.sum(), 1.0), _MIN_SHARE)
    w = np.maximum(win_counts / max(win_counts.sum(), 1.0), _MIN_SHARE)
    return float(np.sum((w - r) * np.log(w / r)))
