"""A version's warmup requests: ``examples`` cast and checked against ``serving_default``, written as
``assets.extra/tf_serving_warmup_requests`` for the server to replay."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.publishing.export_errors import ExportError, one_line

if TYPE_CHECKING:  # only for annotations
    from workbench.core.signatures import Signature, TensorSpec

__all__ = ["MAX_WARMUP_RECORDS", "example_requests", "write_warmup"]

MAX_WARMUP_RECORDS = 1000  # TF Serving's limit; the server refuses a version whose file holds more


def example_requests(examples: Any, signature: Signature) -> list[dict[str, np.ndarray]]:
    """``examples`` as a list of requests, each cast and checked against the signature."""
    if isinstance(examples, Mapping):
        raw: list[Any] = [examples]
    elif isinstance(examples, (list, tuple)) and examples and all(isinstance(e, Mapping) for e in examples):
        raw = list(examples)
    elif isinstance(examples, (list, tuple)) and any(isinstance(e, Mapping) for e in examples):
        raise ExportError("examples mixes dicts with other values: pass one dict per warmup request")
    else:
        if len(signature.inputs) != 1:
            raise ExportError(
                f"examples is a bare array but {DEFAULT_SIGNATURE} has {len(signature.inputs)} inputs "
                f"({', '.join(signature.inputs)}): pass a dict of input name → batch"
            )
        raw = [{next(iter(signature.inputs)): examples}]
    if not raw or (len(raw) == 1 and not raw[0]):
        raise ExportError("examples is empty")
    if len(raw) > MAX_WARMUP_RECORDS:
        raise ExportError(f"{len(raw)} examples given; a version may hold at most {MAX_WARMUP_RECORDS} warmup requests")
    return [_coerce_request(i, request, signature) for i, request in enumerate(raw)]


def _coerce_request(index: int, request: Mapping[str, Any], signature: Signature) -> dict[str, np.ndarray]:
    where = f"example {index}" if index else "examples"
    unknown = [str(alias) for alias in request if alias not in signature.inputs]
    if unknown:
        raise ExportError(
            f"{where} has input {unknown[0]!r}, which {DEFAULT_SIGNATURE} does not take "
            f"(its inputs: {', '.join(signature.inputs)})"
        )
    missing = [alias for alias in signature.inputs if alias not in request and alias not in signature.defaults]
    if missing:
        raise ExportError(f"{where} lacks input {missing[0]!r} of {DEFAULT_SIGNATURE}")
    return {alias: _coerce(where, alias, value, signature.inputs[alias]) for alias, value in request.items()}


def _coerce(where: str, alias: str, value: Any, spec: TensorSpec) -> np.ndarray:
    """``value`` as an array of the input's dtype, or an ExportError naming the input."""
    try:
        array = np.asarray(value)
    except Exception as exc:  # e.g. ragged nested lists
        raise ExportError(f"{where}: input {alias!r} is not an array: {one_line(exc)}") from exc
    if spec.dtype.kind == "O":  # a string input: str or bytes, encoded by make_tensor_proto
        if array.dtype.kind not in "OSU":
            raise ExportError(f"{where}: input {alias!r} must hold strings, got {array.dtype}")
        array = array.astype(object)
    else:
        # "same_kind" lets float64 become float32 and ints become floats, but never floats become ints.
        if array.dtype.kind in "OSUV" or not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
            raise ExportError(f"{where}: input {alias!r} has type {array.dtype}, which cannot become {spec.dtype_name}")
        array = array.astype(spec.dtype)
    if spec.shape is not None:
        fits = array.ndim == len(spec.shape) and all(
            d < 0 or d == n for d, n in zip(spec.shape, array.shape, strict=False)
        )
        if not fits:
            expected = "[" + ", ".join("?" if d < 0 else str(d) for d in spec.shape) + "]"
            raise ExportError(
                f"{where}: input {alias!r} has shape {list(array.shape)}, but {DEFAULT_SIGNATURE} takes {expected}"
            )
    return array


def write_warmup(name: str, path: Path, requests: Sequence[Mapping[str, np.ndarray]], signature: Signature) -> None:
    """``assets.extra/tf_serving_warmup_requests``: one PredictionLog (a PredictRequest) per request.

    Written for every platform: the server replays the file whatever the version holds.
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    from workbench.models.warmup_replay import WARMUP_FILE
    from workbench.protocol.tensor_proto import from_numpy
    from workbench.protocol.tfrecord import encode_record

    target = path / WARMUP_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as records:
        for inputs in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=name, signature_name=DEFAULT_SIGNATURE)
            )
            for alias, array in inputs.items():
                from_numpy(array, request.inputs[alias])
            log_record = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            records.write(encode_record(log_record.SerializeToString()))
