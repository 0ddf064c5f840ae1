"""Two answers to the same request compared, output by output: how a shadow version, or another version on given
inputs (``Client.diff``), differs from the version that answers clients.

Classes and labels (integer, boolean or text outputs) agree row by row when equal; scores and probabilities (float
outputs of several values a row) agree when their argmax does; every float output also gets its absolute and
relative differences. Shapes that differ agree on no row.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class OutputDiff:
    """One output of one request, compared."""

    rows: int
    agreeing: int | None  # rows whose class (or argmax) agrees; None for an output that is no classification
    mean_abs: float | None  # of the float values; None for outputs that are not floats
    max_abs: float | None
    mean_rel: float | None


def compare(primary: Mapping[str, np.ndarray], shadow: Mapping[str, np.ndarray]) -> dict[str, OutputDiff]:
    """Each output both answers hold, compared row by row."""
    diffs = {}
    for alias, ours in primary.items():
        theirs = shadow.get(alias)
        if theirs is None:
            continue
        a, b = np.asarray(ours), np.asarray(theirs)
        rows = a.shape[0] if a.ndim else 1
        if a.shape != b.shape:
            diffs[alias] = OutputDiff(rows, 0, math.inf, math.inf, math.inf)
            continue
        if a.dtype.kind in "fc":
            difference = np.abs(a.astype(np.float64) - b.astype(np.float64))
            scale = np.maximum(np.abs(a.astype(np.float64)), 1e-12)
            agreeing = None
            if a.ndim == 2 and a.shape[1] > 1:  # scores or probabilities: the class is the argmax
                agreeing = int(np.sum(np.argmax(a, axis=1) == np.argmax(b, axis=1)))
            diffs[alias] = OutputDiff(
                rows, agreeing, float(difference.mean()), float(difference.max()), float((difference / scale).mean())
            )
        else:  # classes, labels, text: equal or not, row by row
            same = (a == b).reshape(rows, -1).all(axis=1) if a.ndim else np.array([a == b])
            diffs[alias] = OutputDiff(rows, int(same.sum()), None, None, None)
    return diffs


def output_summary(diffs: Sequence[OutputDiff]) -> dict[str, float | None]:
    """One output over many requests: the share of rows that agree, and the mean and largest differences."""
    rows = sum(d.rows for d in diffs)
    agreeing = [d for d in diffs if d.agreeing is not None]
    numeric = [d for d in diffs if d.mean_abs is not None]
    return {
        "agreement": round(sum(d.agreeing or 0 for d in agreeing) / rows, 6) if agreeing and rows else None,
        "mean_abs_diff": _mean([d.mean_abs for d in numeric]),
        "max_abs_diff": max((d.max_abs for d in numeric if d.max_abs is not None), default=None),
        "mean_rel_diff": _mean([d.mean_rel for d in numeric]),
    }


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None
