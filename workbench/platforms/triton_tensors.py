"""A Triton model's tensors as workbench sees them: its config's inputs and outputs as numpy, shaped as declared.

Shared by every Triton backend workbench serves (:mod:`workbench.platforms.triton` for ONNX and TensorFlow,
:mod:`workbench.platforms.triton_python` for the Python backend): the signature a config describes, the wire shape
(a batch dimension first when ``max_batch_size`` > 0), ``reshape`` on the way in and back on the way out, and the
rows of a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from workbench.config.triton_model_config import TritonConfig, TritonTensor
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import (
    DEFAULT_SIGNATURE,
    OMITTED,
    PREDICT_METHOD,
    Signature,
    TensorSpec,
    describe_array,
    input_error,
)


def wire_shape(tensor: TritonTensor, config: TritonConfig) -> tuple[int, ...]:
    return (-1, *tensor.dims) if config.batched else tensor.dims


def model_shape(tensor: TritonTensor, config: TritonConfig) -> tuple[int, ...]:
    return (-1, *tensor.model_dims) if config.batched else tensor.model_dims


def spec_of(tensor: TritonTensor, config: TritonConfig) -> TensorSpec:
    return TensorSpec(alias=tensor.name, name=tensor.name, dtype=tensor.dtype, shape=wire_shape(tensor, config))


def signature_of(config: TritonConfig, inputs: Sequence[TritonTensor], outputs: Sequence[TritonTensor]) -> Signature:
    """``serving_default`` as clients see the model: the config's tensors, their dims, a batch dimension first."""
    return Signature(
        name=DEFAULT_SIGNATURE,
        method_name=PREDICT_METHOD,
        inputs={t.name: spec_of(t, config) for t in inputs},
        outputs={t.name: spec_of(t, config) for t in outputs},
        defaults={t.name: OMITTED for t in inputs if t.optional},
        batchable=config.batched,
    )


def model_inputs(
    config: TritonConfig, signature: Signature, tensors: Mapping[str, TritonTensor], feed: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """A request's inputs as the model takes them: shapes checked against the config, reshaped, absent ones left out.

    Triton refuses a batch larger than ``max_batch_size`` and an input whose shape is not its dims; so does this.
    """
    converted: dict[str, np.ndarray] = {}
    for alias, value in feed.items():
        if value is OMITTED:
            continue
        spec = signature.inputs[alias]
        tensor = tensors[alias]
        if not spec.admits_shape(value.shape):
            raise input_error(
                spec, describe_array(value), f"{config.file.parent.name} declares dims {list(tensor.dims)}"
            )
        if config.batched and value.shape[0] > config.max_batch_size:
            raise input_error(
                spec, describe_array(value), f"the batch size must be at most {config.max_batch_size} (max_batch_size)"
            )
        converted[alias] = _reshaped(value, tensor, config)
    return converted


def wire_output(value: np.ndarray, tensor: TritonTensor, config: TritonConfig, rows: int | None) -> np.ndarray:
    """An output as clients get it: reshaped from ``reshape`` back to its dims (``rows`` keeps the batch)."""
    if tensor.reshape is None:
        return value
    shape = (rows if rows is not None else value.shape[0], *tensor.dims) if config.batched else tensor.dims
    try:
        return value.reshape(shape)
    except ValueError:
        raise ServingError(
            Code.INTERNAL,
            f'Output "{tensor.name}" of shape {list(value.shape)} cannot be reshaped to its dims {list(tensor.dims)}',
        ) from None


def _reshaped(value: np.ndarray, tensor: TritonTensor, config: TritonConfig) -> np.ndarray:
    if tensor.reshape is None:
        return value
    shape = (value.shape[0], *tensor.reshape) if config.batched else tensor.reshape
    try:
        return value.reshape(shape)
    except ValueError:
        raise input_error(
            spec_of(tensor, config), describe_array(value), f"it cannot be reshaped to {list(tensor.reshape)}"
        ) from None


def output_labels(config: TritonConfig, outputs: Sequence[TritonTensor]) -> dict[str, list[str]]:
    """Each output's class labels from its ``label_filename`` (one per line, beside config.pbtxt), for Triton's
    classification extension; a label file that cannot be read fails the load naming it."""
    labels: dict[str, list[str]] = {}
    for tensor in outputs:
        if not tensor.label_filename:
            continue
        file = config.file.parent / tensor.label_filename
        try:
            labels[tensor.name] = file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
            raise ServingError(
                Code.NOT_FOUND, f'{config.file}: label_filename of output "{tensor.name}": cannot read {file}: {reason}'
            ) from None
    return labels


def batch_rows(feed: Mapping[str, np.ndarray], config: TritonConfig) -> int | None:
    """The request's batch size (None: the model has no batch dimension, or only absent inputs were given)."""
    if not config.batched:
        return None
    return next((v.shape[0] for v in feed.values() if v.ndim and v.shape[0]), None)


# ------------------------------------------------------------------------- ONNX and TensorFlow models
def fits(declared: tuple[int, ...], actual: tuple[int, ...] | None) -> bool:
    """Whether the model's own shape takes what the config declares (-1 on either side takes any size)."""
    if actual is None:
        return True
    return len(declared) == len(actual) and all(a == b or -1 in (a, b) for a, b in zip(declared, actual, strict=True))
