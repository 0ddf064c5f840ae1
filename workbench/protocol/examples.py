"""tf.Example inputs for classify / regress: from TF Serving's JSON, and from the ``Input`` proto.

Both frontends end in :func:`serialized_examples`, so the rule for merging a context into each example lives
here once. The protos come from ``tensorflow-serving-api``/``tensorflow`` and need no TensorFlow runtime.
"""

from __future__ import annotations

import binascii
import math
from typing import Any

from workbench.core.errors import invalid_argument
from workbench.protocol.bytes_codec import from_b64, is_b64
from workbench.protocol.json_tensor import (
    _json_type,
    dumps_value,
    parse_body,
    signature_name_of,
)

_MAX_FLOAT32 = 3.4028234663852886e38


_KIND_NAMES = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}


def _feature_kind_error(name: str, kind: str) -> Exception:
    return invalid_argument(f"Unexpected element type in feature: {name} expecting type: {_KIND_NAMES[kind]}")


def _add_value(feature: Any, name: str, value: Any) -> None:
    kind = feature.WhichOneof("kind")
    if value is None or isinstance(value, list) or (isinstance(value, dict) and not is_b64(value)):
        raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: {_json_type(value)}")
    if isinstance(value, bool):
        if kind not in (None, "int64_list"):
            raise _feature_kind_error(name, kind)
        feature.int64_list.value.append(int(value))
    elif isinstance(value, (str, dict)):
        if kind not in (None, "bytes_list"):
            raise _feature_kind_error(name, kind)
        if isinstance(value, str):
            feature.bytes_list.value.append(value.encode("utf-8"))
        else:
            try:
                feature.bytes_list.value.append(from_b64(value))
            except (binascii.Error, ValueError):
                raise invalid_argument("Unable to base64 decode") from None
    elif isinstance(value, float):
        if kind not in (None, "float_list"):
            raise _feature_kind_error(name, kind)
        if math.isfinite(value) and abs(value) > _MAX_FLOAT32:
            raise invalid_argument(f"Cannot convert JSON value: {value} to float without loss of precision.")
        feature.float_list.value.append(value)
    else:  # a JSON integer
        if kind not in (None, "int64_list"):
            raise _feature_kind_error(name, kind)
        if value >= 1 << 63:
            raise invalid_argument(f"Feature: {name} has uint64 element. Only int64 is supported.")
        if value < -(1 << 63):
            raise invalid_argument(f"Feature: {name} has an integer that does not fit in int64.")
        feature.int64_list.value.append(value)


def example_from_json(value: Any, example: Any) -> None:
    """Fill a ``tf.train.Example`` from ``{feature: value | [values]}``; the JSON token picks the type."""
    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name, content in value.items():
        feature = example.features.feature[name]
        for item in content if isinstance(content, list) else [content]:
            _add_value(feature, name, item)


def input_from_json(body: bytes) -> tuple[str, Any]:
    """A ``:classify``/``:regress`` body as (signature name, ``tensorflow.serving.Input`` proto)."""
    from tensorflow_serving.apis import input_pb2

    doc = parse_body(body)
    signature_name = signature_name_of(doc)
    request_input = input_pb2.Input()
    has_context = "context" in doc
    if has_context:
        example_from_json(doc["context"], request_input.example_list_with_context.context)
    examples = doc.get("examples")
    if "examples" not in doc:
        raise invalid_argument(
            f"JSON Value: {dumps_value(doc)} When method is classify, key 'examples' is expected and was not found"
        )
    if not isinstance(examples, list):
        raise invalid_argument(f"JSON Value: {dumps_value(doc)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise invalid_argument(f"JSON Value: {dumps_value(doc)} 'examples' value is an empty array")
    target = request_input.example_list_with_context if has_context else request_input.example_list
    for item in examples:
        example_from_json(item, target.examples.add())
    return signature_name, request_input


def serialized_examples(request_input: Any) -> list[bytes]:
    """The serialized examples an ``Input`` carries, each merged with the context if there is one."""
    kind = request_input.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in request_input.example_list.examples]
    if kind == "example_list_with_context":
        with_context = request_input.example_list_with_context
        # Concatenated serializations parse as a merge: the context's features, then the example's own.
        context = with_context.context.SerializeToString()
        return [context + e.SerializeToString() for e in with_context.examples]
    raise invalid_argument("Input is empty.")
