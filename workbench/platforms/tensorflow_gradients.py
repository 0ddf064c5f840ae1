"""A SavedModel's gradients, for integrated gradients (:class:`~workbench.core.differentiable.Differentiable`).

The served graph session cannot take a ``tf.GradientTape``: the SavedModel is read again, eagerly
(``tf.saved_model.load``), once per served version, and TensorFlow itself is imported only then.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError


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


# Each servable's eagerly loaded SavedModel, dropped with the servable.
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
