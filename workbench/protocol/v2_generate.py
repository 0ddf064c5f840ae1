"""Triton's generate extension (``/generate``, ``/generate_stream``) ↔ numpy: plain JSON values in and out.

A generate request is one JSON object: ``id`` (optional), ``parameters`` (optional), and any other key. As Triton
does ("any additional properties in the request object are passed either as parameters or tensors based on model
specification"), a key that names one of the model's inputs is that input, any other key a request parameter. An
input's value is a JSON scalar or (nested) list, read as the input's dtype; its shape is the value's (a scalar is
``[1]``), with leading dimensions of 1 added up to the input's declared rank, so ``{"text_input": "hi"}`` feeds an
input declared ``[-1, 1]`` as ``[["hi"]]``.

A response is ``model_name``, ``model_version`` (and ``id`` when the request had one) beside the outputs by name: an
output of one element as that element (a string for BYTES), any other as a nested list. For ``/generate_stream``
each response is one server-sent event, ``data: {...}`` and a blank line; an error is ``data: {"error": "..."}``.
Pure: no engine, no server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.core.signatures import TensorSpec

_RESERVED = ("id", "parameters")


def decode_request(
    doc: Any, specs: Mapping[str, TensorSpec]
) -> tuple[dict[str, np.ndarray], dict[str, Any], str | None]:
    """A generate request's inputs (as ``specs`` type them), its parameters and its id."""
    if not isinstance(doc, dict):
        raise invalid_argument("A generate request is a JSON object: input names to values, and parameters")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise invalid_argument('"id" must be a string')
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise invalid_argument('"parameters" must be a JSON object')
    parameters = dict(parameters)
    inputs: dict[str, np.ndarray] = {}
    for key, value in doc.items():
        if key in _RESERVED:
            continue
        spec = specs.get(key)
        if spec is None:  # Triton's rule: what is not an input of the model is a parameter
            parameters[key] = value
            continue
        inputs[key] = _tensor(key, value, spec)
    return inputs, parameters, request_id


def _tensor(name: str, value: Any, spec: TensorSpec) -> np.ndarray:
    try:
        if spec.dtype.kind == "O":
            array = np.asarray(value, dtype=object)
            array = np.vectorize(_text, otypes=[object])(array) if array.size else array
        else:
            array = np.asarray(value, dtype=spec.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        kind = "string" if spec.dtype.kind == "O" else str(spec.dtype)
        raise invalid_argument(f'Input "{name}" takes {kind} values: {exc}') from None
    if array.ndim == 0:
        array = array.reshape(1)
    if spec.shape is not None and array.ndim < len(spec.shape):  # a batch (or row) dimension the value leaves out
        array = array.reshape((1,) * (len(spec.shape) - array.ndim) + array.shape)
    return array


def _text(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"a string input takes JSON strings, not {type(value).__name__}")


def encode_response(
    model_name: str, model_version: int, outputs: Mapping[str, np.ndarray], request_id: str | None = None
) -> dict[str, Any]:
    """One generate response as a JSON-ready dict."""
    doc: dict[str, Any] = {"model_name": model_name, "model_version": str(model_version)}
    if request_id is not None:
        doc["id"] = request_id
    for name, value in outputs.items():
        if name in doc:
            raise ServingError(Code.INTERNAL, f'Output "{name}" has the name of a generate response field')
        doc[name] = _value(name, np.asarray(value))
    return doc


def _value(name: str, value: np.ndarray) -> Any:
    if value.dtype.kind in "OSU":
        try:
            value = np.vectorize(_decoded, otypes=[object])(value) if value.size else value.astype(object)
        except UnicodeDecodeError:
            raise ServingError(
                Code.INTERNAL, f'Output "{name}" holds bytes that are not UTF-8 text, which JSON cannot carry'
            ) from None
    return value.reshape(-1).tolist()[0] if value.size == 1 else value.tolist()


def _decoded(item: Any) -> str:
    return item.decode() if isinstance(item, bytes) else str(item)


def event(doc: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``doc``."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def error_event(message: str) -> bytes:
    """The event of an error once the stream has begun (its HTTP status, 200, is already sent)."""
    return event({"error": message})
