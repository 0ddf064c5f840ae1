"""Models of the platforms other than TensorFlow's (scikit-learn, XGBoost, LightGBM, ONNX, Python, pipelines): which
platform takes a model, and its writer of the version folder."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workbench import platforms
from workbench.publishing.errors import ExportError

__all__ = ["platform_writer"]


def platform_writer(
    model: Any, format: str | None, signatures: Mapping[str, Any] | None, examples: Any
) -> Callable[[Path], None] | None:
    """How to write ``model`` if a platform other than TensorFlow's takes it (None: the SavedModel route)."""
    if format == "onnx":
        onnx_platform = importlib.import_module("workbench.platforms.onnx")

        if not onnx_platform.exports(model):
            model = onnx_platform.convert_sklearn(model, _sample_rows(examples))
        return functools.partial(onnx_platform.write, model)
    if format not in (None, "saved_model", "tensorflow"):
        raise ExportError(f"format must be 'onnx' or left out (the model's own platform), not {format!r}")
    if format is None:
        for platform in platforms.registry().values():
            if platform.name in ("tensorflow", "workbench_null"):
                continue
            try:
                module = importlib.import_module(platform.module)
            except ImportError:  # a platform plugin whose own module cannot import: it cannot take the model
                continue
            exports = getattr(module, "exports", None)
            if exports is not None and exports(model):
                if signatures:
                    raise ExportError(f"signatures= is for TensorFlow models; a {platform.name} model declares its own")
                return functools.partial(module.write, model)
    return None


def _sample_rows(examples: Any) -> Any:
    """Rows that show skl2onnx the input's width and type (the one input's batch, from ``examples``)."""
    if examples is None:
        raise ExportError("format='onnx' needs examples= (a batch of inputs) to know the model's input shape")
    if isinstance(examples, Mapping):
        if len(examples) != 1:
            raise ExportError("format='onnx' takes examples= as one batch (or a dict with one input)")
        return np.asarray(next(iter(examples.values())))
    return np.asarray(examples)
