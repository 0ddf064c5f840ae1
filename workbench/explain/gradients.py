"""Integrated gradients (Sundararajan et al., 2017) for differentiable models: Keras/TensorFlow and PyTorch.

An input's attribution is ``(x - baseline) * mean(gradient of the output along the straight path baseline → x)``;
the attributions add up to ``F(x) - F(baseline)`` up to the integral's error (reported as ``deltas``; more
``steps`` shrink it). The integral is the trapezoid rule on ``steps`` intervals, computed in chunks of rows so a
large image batch does not hold every interpolated input at once, with the time budget checked between chunks.

A framework is one :class:`Gradients`: the model's output columns for a batch, and the gradient of one chosen
column per row with respect to the input. TensorFlow's reads the SavedModel again, eagerly
(``tf.saved_model.load``; the served graph session cannot take a GradientTape), once per served version.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.protocol.explanations import Budget, as_columns, pick_targets

CHUNK_ELEMENTS = 4_000_000  # interpolated input elements per gradient call (16 MB of float32)


class Gradients(Protocol):
    output_name: str  # the signature output explained

    def outputs(self, rows: np.ndarray) -> np.ndarray:
        """The explained output for ``rows``, as [n, k]."""

    def gradients(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """d output[i, targets[i]] / d rows[i], shaped as ``rows``."""


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


# --------------------------------------------------------------------------------------------- TensorFlow
class SavedModelGradients:
    """A SavedModel signature, loaded eagerly, differentiated with ``tf.GradientTape``."""

    def __init__(self, function: Any, input_alias: str, output_alias: str) -> None:
        self._fn, self._input, self._output = function, input_alias, output_alias
        self.output_name = output_alias

    def _call(self, x: Any) -> Any:
        import tensorflow as tf

        out = self._fn(**{self._input: x})[self._output]
        return tf.reshape(tf.cast(out, tf.float64), (tf.shape(out)[0], -1))

    def outputs(self, rows: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        return np.asarray(self._call(tf.constant(rows)).numpy())

    def gradients(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        x = tf.constant(rows)
        with tf.GradientTape() as tape:
            tape.watch(x)
            picked = tf.gather(self._call(x), tf.constant(targets), batch_dims=1)
        grads = tape.gradient(picked, x)
        if grads is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"The output {self._output} does not depend differentiably on the input {self._input}: integrated "
                "gradients cannot explain it",
            )
        return np.asarray(grads.numpy())


_LOADED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_LOADED_LOCK = threading.Lock()


def saved_model_signature(servable: Any, signature_name: str) -> Callable[..., Any]:
    """``signature_name``'s function of the servable's SavedModel, loaded eagerly once per servable."""
    with _LOADED_LOCK:
        functions = _LOADED.setdefault(servable, {})
        if "model" not in functions:
            import tensorflow as tf

            try:
                functions["model"] = tf.saved_model.load(servable.path)
            except Exception as exc:  # noqa: BLE001 - a TF1-era graph TF2's loader cannot read eagerly
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"Integrated gradients load the SavedModel eagerly (tf.saved_model.load), which failed for "
                    f"{servable.path}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                ) from None
        signatures = functions["model"].signatures
    if signature_name not in signatures:
        raise ServingError(Code.FAILED_PRECONDITION, f'Serving signature key "{signature_name}" not found.')
    return signatures[signature_name]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------- PyTorch
class ModuleGradients:
    """A served PyTorch module, differentiated with ``torch.autograd`` (outside the server's inference mode).

    ``call(x)`` runs the module on one input tensor as the platform runs it (its own argument structure) and gives
    back ``forward()``'s result; ``output`` picks the explained tensor out of it.
    """

    def __init__(self, call: Callable[[Any], Any], output: Callable[[Any], Any], output_name: str, device: Any) -> None:
        self._call_module, self._pick, self.output_name, self._device = call, output, output_name, device

    def _call(self, x: Any) -> Any:
        out = self._pick(self._call_module(x))
        return out.reshape(out.shape[0], -1).double()

    def outputs(self, rows: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            x = torch.from_numpy(np.ascontiguousarray(rows)).to(self._device)
            return np.asarray(self._call(x).cpu().numpy())

    def gradients(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        import torch

        x = torch.from_numpy(np.ascontiguousarray(rows)).to(self._device).requires_grad_(True)
        with torch.enable_grad():
            picked = self._call(x).gather(1, torch.from_numpy(targets).to(self._device).reshape(-1, 1)).sum()
            if not picked.requires_grad:
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"The output {self.output_name} does not depend differentiably on the input: integrated "
                    "gradients cannot explain it",
                )
            (grads,) = torch.autograd.grad(picked, x, allow_unused=True)
        if grads is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"The output {self.output_name} does not depend on the input: integrated gradients cannot explain it",
            )
        return np.asarray(grads.detach().cpu().numpy())
