"""``TensorProto`` ↔ numpy for gRPC.

Requests: the common dtypes are decoded here with TensorFlow's rules (``tensor_content`` is raw bytes; typed
``*_val`` fields with fewer values than the shape repeat the last one, none means zeros) at a fraction of
``tf.make_ndarray``'s per-call cost; rare dtypes go to ``tf.make_ndarray`` itself. Responses use the typed
fields, as TF Serving does by default, so clients that read ``response.outputs["y"].float_val`` keep working.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.errors import invalid_argument
from workbench.protocol import tf_types
from workbench.signatures import TensorSpec, input_error, shape_text

_FIELDS = tf_types.FIELDS
_DT_STRING = tf_types.DT_STRING
_DECODE: dict[int, tuple[np.dtype[Any], str]] = {
    enum: (dtype, field) for dtype, (enum, field) in _FIELDS.items() if dtype.kind != "c"
}


def to_numpy(proto: Any, alias: str, spec: TensorSpec | None = None) -> np.ndarray:
    """The array a request's TensorProto holds; a malformed one is INVALID_ARGUMENT naming the input.

    ``spec`` (the signature's input of that alias, when it has one) lets the error say what was expected.
    """
    try:
        entry = _DECODE.get(proto.dtype)
        if entry is None and proto.dtype != _DT_STRING:
            import tensorflow as tf

            return tf.make_ndarray(proto)
        shape = tuple(d.size for d in proto.tensor_shape.dim)
        count = 1
        for d in shape:
            count *= d
        if entry is None:  # DT_STRING
            values: Any = list(proto.string_val)
            if values and len(values) < count:
                values.extend([values[-1]] * (count - len(values)))
            array = np.empty(len(values), dtype=object)
            array[:] = values
            if not values:
                array = np.full(count, b"", dtype=object)
            return array.reshape(shape)
        dtype, field = entry
        if proto.tensor_content:
            return np.frombuffer(proto.tensor_content, dtype=dtype).reshape(shape)
        raw = getattr(proto, field)
        values = np.array(raw, dtype=np.uint16).view(np.float16) if field == "half_val" else np.array(raw, dtype)
        if values.size == count:
            return values.reshape(shape)
        if values.size == 0:
            return np.zeros(shape, dtype)
        if values.size < count:
            return np.pad(values, (0, count - values.size), "edge").reshape(shape)
        raise ValueError(f"{values.size} values do not fit the shape {list(shape)}")
    except Exception as exc:  # malformed content: wrong sizes, unknown dtype
        detail = f"Could not parse input tensor {alias}: {exc}"
        if spec is None:
            raise invalid_argument(detail) from None
        raise input_error(
            spec, f"a malformed TensorProto ({_proto_type(proto)} {_proto_shape(proto)})", detail
        ) from None


def _proto_type(proto: Any) -> str:
    return tf_types.enum_name(proto.dtype)


def _proto_shape(proto: Any) -> str:
    if proto.tensor_shape.unknown_rank:
        return "of unknown rank"
    return shape_text([d.size for d in proto.tensor_shape.dim])


def from_numpy(array: np.ndarray, proto: Any) -> Any:
    """Fill ``proto`` (a TensorProto) with ``array``; returns it."""
    array = np.asarray(array)
    for dim in array.shape:
        proto.tensor_shape.dim.add().size = dim
    if array.dtype.kind in "OSU":
        proto.dtype = _DT_STRING
        proto.string_val.extend(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1))
        return proto
    entry = _FIELDS.get(array.dtype)
    if entry is None or array.dtype.kind == "c":
        import tensorflow as tf

        proto.CopyFrom(tf.make_tensor_proto(array))  # complex and other rare types: tensor_content
        return proto
    dtype_enum, field = entry
    proto.dtype = dtype_enum
    flat = array.reshape(-1)
    if field == "half_val":
        flat = flat.view(np.uint16)
    getattr(proto, field).extend(flat.tolist())
    return proto
