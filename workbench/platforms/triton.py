"""Triton models: a version folder whose model folder holds ``config.pbtxt``, served as that config says.

The config (:mod:`workbench.config.triton_model_config`) names the backend; the version folder holds its file
(``model.onnx``, ``model.savedmodel/``, ``model.py``, ``model.pt``, or ``default_model_filename``), loaded by
workbench's own platform for it. What clients see is the config: the signature's tensors are its inputs and
outputs with their data types and dims (a batch dimension first when ``max_batch_size`` > 0), each input reshaped to
``reshape`` before the model sees it and each output reshaped back to its dims, and at most ``instance_group``'s
count of runs at once. Inputs are checked against their declared shapes before running, as Triton does. A config
without inputs or outputs is completed from an ONNX or TensorFlow model, as Triton's auto-complete does; a PyTorch
(TorchScript) model's config declares them, paired with forward()'s parameters and results as Triton's libtorch
backend pairs them (``INPUT__0``, ``OUTPUT__0``: :func:`workbench.platforms.pytorch.triton_declaration`). Decoupled
models and
sequence batching are the Python backend's (:mod:`workbench.platforms.triton_python`); the config refuses them for
the others.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from workbench.config.triton_model_config import (
    ONNX,
    PYTHON,
    PYTORCH,
    TENSORFLOW,
    TritonConfig,
    TritonTensor,
    config_json,
    read_config,
)
from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import (
    DEFAULT_SIGNATURE,
    Signature,
    TensorSpec,
)
from workbench.platforms.base import LoadPolicy
from workbench.platforms.triton_tensors import batch_rows, fits, model_inputs, model_shape, signature_of, wire_output


def load(name: str, version: int, path: str, policy: LoadPolicy, platform: str = "") -> Servable:
    """Load version folder ``path`` of the Triton model whose ``config.pbtxt`` is in the folder above it."""
    config = read_config(Path(path).parent)
    if platform and platform != config.platform:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'Model {name}: model_platform "{platform}" contradicts {config.file}, which serves it with '
            f"{config.platform}; leave model_platform out",
        )
    if config.platform == PYTHON:
        from workbench.platforms import triton_python

        servable: Servable = triton_python.load(name, version, path, policy, config)
    else:
        servable = _load_framework(name, version, path, policy, config)
    servable.platform = config.platform
    return servable


def _load_framework(name: str, version: int, path: str, policy: LoadPolicy, config: TritonConfig) -> Servable:
    model_file = config.model_file(path)
    if not model_file.exists():
        raise ServingError(Code.NOT_FOUND, f"No {model_file.name} in {path} (the model file {config.file} names)")
    inner: Servable
    if config.platform == ONNX:
        from workbench.platforms import onnx

        inner = onnx.OnnxServable(name, version, path, model_file.name)
    elif config.platform == TENSORFLOW:
        from workbench.platforms import tensorflow

        inner = tensorflow.load_saved_model(name, version, str(model_file))
    elif config.platform == PYTORCH:
        from workbench.platforms import pytorch

        # TorchScript records no types: the config's tensors declare them (Triton's libtorch backend requires them).
        declare = functools.partial(pytorch.triton_declaration, config.inputs, config.outputs, config.batched)
        inner = pytorch.TorchServable(name, version, path, policy, model_file.name, declare=declare)
    else:  # pragma: no cover - triton_config only returns the platforms above
        raise ServingError(Code.UNIMPLEMENTED, f"{config.file}: {config.platform} is not supported by workbench")
    try:
        return TritonServable(inner, config)
    except BaseException:
        inner.close()
        raise


# ------------------------------------------------------------------------------------------- shapes
def _completed(config: TritonConfig, specs: Mapping[str, TensorSpec], kind: str) -> tuple[TritonTensor, ...]:
    """Tensors the config does not declare, taken from the model (Triton's auto-complete)."""
    from workbench.protocol.v2_types import to_datatype

    tensors = []
    for spec in specs.values():
        shape = spec.shape if spec.shape is not None else (-1,)
        if config.batched:
            if not shape or shape[0] != -1:
                raise ServingError(
                    Code.INVALID_ARGUMENT,
                    f"{config.file}: max_batch_size is {config.max_batch_size} but the model's {kind} {spec.alias} "
                    f"has no batch dimension ({spec.describe()}); declare the {kind}s, or set max_batch_size: 0",
                )
            shape = shape[1:]
        datatype = to_datatype(spec.dtype)
        tensors.append(
            TritonTensor(spec.alias, spec.dtype, "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}", shape)
        )
    return tuple(tensors)


def _check_against(
    config: TritonConfig, tensors: Sequence[TritonTensor], specs: Mapping[str, TensorSpec], kind: str
) -> None:
    for tensor in tensors:
        spec = specs.get(tensor.name)
        if spec is None:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: {kind} "{tensor.name}" is not one of the model\'s {kind}s '
                f"({', '.join(specs) or 'none'})",
            )
        if spec.dtype != tensor.dtype:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: {kind} "{tensor.name}" is declared {tensor.data_type} but the model\'s is '
                f"{spec.dtype_name}",
            )
        if not fits(model_shape(tensor, config), spec.shape):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: {kind} "{tensor.name}" is declared with shape {list(model_shape(tensor, config))} '
                f"(batch dimension, then {'reshape' if tensor.reshape is not None else 'dims'}) but the model's is "
                f"{spec.describe()}",
            )


class TritonServable(Servable):
    """An ONNX or TensorFlow model served as its config.pbtxt describes it."""

    def __init__(self, inner: Servable, config: TritonConfig) -> None:
        self.name, self.version, self.path = inner.name, inner.version, inner.path
        self._inner = inner
        self._config = config
        own = inner.signatures.get(DEFAULT_SIGNATURE)
        if own is None:
            raise ServingError(Code.FAILED_PRECONDITION, f"{inner.path} has no {DEFAULT_SIGNATURE} signature to serve")
        self._own = own
        inputs = config.inputs or _completed(config, own.inputs, "input")
        outputs = config.outputs or _completed(config, own.outputs, "output")
        _check_against(config, inputs, own.inputs, "input")
        _check_against(config, outputs, own.outputs, "output")
        self._inputs = {t.name: t for t in inputs}
        self._outputs = {t.name: t for t in outputs}
        self.signatures = {DEFAULT_SIGNATURE: signature_of(config, inputs, outputs)}
        self.model_config = config_json(config, inner.name, inputs, outputs)
        # Triton's instances: at most this many runs at once (each instance runs one request or batch at a time).
        self._instances = threading.BoundedSemaphore(config.instance_count)

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feed = model_inputs(self._config, signature, self._inputs, inputs)
        rows = batch_rows(inputs, self._config)
        with self._instances:
            result = self._inner.run(self._own, feed, outputs)
        return {alias: wire_output(result[alias], self._outputs[alias], self._config, rows) for alias in outputs}

    def close(self) -> None:
        self._inner.close()
