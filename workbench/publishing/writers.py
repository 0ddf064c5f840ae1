"""Models of the platforms other than TensorFlow's (scikit-learn, XGBoost, LightGBM, ONNX, PyTorch, Python, pipelines):
which platform takes a model, and its writer of the version folder."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workbench.platforms import registry
from workbench.publishing.errors import ExportError

__all__ = ["platform_writer"]


def platform_writer(
    model: Any, format: str | None, signatures: Mapping[str, Any] | None, examples: Any, example_inputs: Any = None
) -> Callable[[Path], None] | None:
    """How to write ``model`` if a platform other than TensorFlow's takes it (None: the SavedModel route).

    ``example_inputs`` are what a PyTorch module is traced with (else ``examples``, its warmup requests).
    """
    pytorch = _pytorch_writer(model, format, signatures, examples, example_inputs)
    if pytorch is not None:
        return pytorch
    if example_inputs is not None:
        raise ExportError("example_inputs= is for PyTorch modules (what torch.export traces them with)")
    if format == "onnx":
        onnx_platform = importlib.import_module("workbench.platforms.onnx")

        if not onnx_platform.exports(model):
            model = onnx_platform.convert_sklearn(model, _sample_rows(examples))
        return functools.partial(onnx_platform.write, model)
    if format not in (None, "saved_model", "tensorflow"):
        raise ExportError(
            f"format must be 'onnx', 'pt2' or 'torchscript' (PyTorch modules), or left out (the model's own "
            f"platform), not {format!r}"
        )
    if format is None:
        for platform in registry().values():
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


def _pytorch_writer(
    model: Any, format: str | None, signatures: Mapping[str, Any] | None, examples: Any, example_inputs: Any
) -> Callable[[Path], None] | None:
    """A ``torch.nn.Module`` (or ``ExportedProgram``) written as ``model.pt2`` or TorchScript; None for the rest."""
    pytorch = importlib.import_module("workbench.platforms.pytorch")
    if not pytorch.exports(model):
        if format in pytorch.FORMATS:
            raise ExportError(f"format={format!r} is for PyTorch modules; this is a {type(model).__name__}")
        return None
    if format not in (None, *pytorch.FORMATS):
        raise ExportError(f"A PyTorch module is written as 'pt2' (the default) or 'torchscript', not {format!r}")
    if signatures:
        raise ExportError("signatures= is for TensorFlow models; a PyTorch module's signature is its forward()")
    if example_inputs is None and examples is not None:
        # The warmup requests show the inputs too: one batch (a single input) or a dict of inputs by name.
        example_inputs = (
            examples[0]
            if isinstance(examples, (list, tuple)) and examples and isinstance(examples[0], Mapping)
            else examples
        )
    return functools.partial(pytorch.write, model, example_inputs=example_inputs, format=format)


def _sample_rows(examples: Any) -> Any:
    """Rows that show skl2onnx the input's width and type (the one input's batch, from ``examples``)."""
    if examples is None:
        raise ExportError("format='onnx' needs examples= (a batch of inputs) to know the model's input shape")
    if isinstance(examples, Mapping):
        if len(examples) != 1:
            raise ExportError("format='onnx' takes examples= as one batch (or a dict with one input)")
        return np.asarray(next(iter(examples.values())))
    return np.asarray(examples)
