"""Integrated gradients (Sundararajan et al., 2017) for differentiable models: Keras/TensorFlow and PyTorch.

An input's attribution is ``(x - baseline) * mean(gradient of the output along the straight path baseline → x)``;
the attributions add up to ``F(x) - F(baseline)`` up to the integral's error (reported as ``deltas``; more
``steps`` shrink it). The integral is the trapezoid rule on ``steps`` intervals, computed in chunks of rows so a
large image batch does not hold every interpolated input at once, with the time budget checked between chunks.

A model is one :class:`~workbench.core.differentiable.Gradients`: its output columns for a batch, and the gradient
of one chosen column per row with respect to the input. Its platform's servable gives it
(:class:`~workbench.core.differentiable.Differentiable`: a SavedModel's in
:mod:`workbench.platforms.tensorflow_gradients`, a PyTorch module's in :mod:`workbench.platforms.pytorch_gradients`).
"""

from __future__ import annotations

import numpy as np

from workbench.core.differentiable import Gradients
from workbench.core.errors import Code, ServingError
from workbench.protocol.attributions import Budget, as_columns, pick_targets

CHUNK_ELEMENTS = 4_000_000  # interpolated input elements per gradient call (16 MB of float32)


def integrated_gradients(
    model: Gradients, rows: np.ndarray, baseline: float, steps: int, target: int | None, budget: Budget, what: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(targets [n], attributions [n, ...], base values [n], values [n], deltas [n]) for ``rows``."""
    rows = np.asarray(rows)
    if rows.dtype.kind != "f":
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"Integrated gradients need a floating-point input; {what} takes {rows.dtype}, which has no gradient",
        )
    reference = np.full_like(rows, baseline)
    outputs = as_columns(model.outputs(rows))
    targets = pick_targets(outputs, target, what)
    values = outputs[np.arange(len(rows)), targets]
    base = as_columns(model.outputs(reference))[np.arange(len(rows)), targets]

    alphas = np.linspace(0.0, 1.0, steps + 1, dtype=rows.dtype)
    weights = np.full(steps + 1, 1.0 / steps)
    weights[[0, -1]] = 0.5 / steps  # the trapezoid rule
    row_elements = int(np.prod(rows.shape[1:], dtype=np.int64)) or 1
    per_chunk = max(1, CHUNK_ELEMENTS // row_elements)  # interpolated rows per gradient call
    attributions = np.zeros(rows.shape, dtype=np.float64)
    for i in range(len(rows)):
        difference = rows[i] - reference[i]
        total = np.zeros(rows.shape[1:], dtype=np.float64)
        for start in range(0, steps + 1, per_chunk):
            budget.check(f"finishing row {i} of {len(rows)} ({steps} steps each)")
            a = alphas[start : start + per_chunk]
            path = reference[i][np.newaxis] + a.reshape(-1, *([1] * difference.ndim)) * difference[np.newaxis]
            grads = model.gradients(path.astype(rows.dtype), np.full(len(a), targets[i], dtype=np.int64))
            w = weights[start : start + per_chunk].reshape(-1, *([1] * difference.ndim))
            total += (np.asarray(grads, dtype=np.float64) * w).sum(axis=0)
        attributions[i] = total * difference
    sums = attributions.reshape(len(rows), -1).sum(axis=1)
    deltas = np.abs(sums - (values - base))
    return targets, attributions, base, values, deltas
