"""``TensorProto`` ↔ numpy for gRPC.

Requests: the common dtypes are decoded here with TensorFlow's rules (``tensor_content`` is raw bytes; typed
``*_val`` fields with fewer values than the shape repeat the last one, none means zeros) at a fraction of
``tf.make_ndarray``'s per-call cost; rare dtypes go to ``tf.make_ndarray`` itself. Responses use the typed
fields, as TF Serving does by default, so clients that read ``response.outputs["y"].float_val`` keep working.

float and double answers (most of them) are written as protobuf wire bytes and parsed into the TensorProto at
once: a packed ``float_val``/``double_val`` is the array's little-endian bytes, so filling it costs a copy, where
``extend(array.tolist())`` costs a Python float per value.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.core.signatures import TensorSpec, input_error, shape_text
from workbench.protocol import tf_types

_FIELDS = tf_types.FIELDS
_DT_STRING = tf_types.DT_STRING
_DECODE: dict[int, tuple[np.dtype[Any], str]] = {
    enum: (dtype, field) for dtype, (enum, field) in _FIELDS.items() if dtype.kind != "c"
}
# TensorProto's field numbers (tensorflow/core/framework/tensor.proto) for the wire-bytes path of from_numpy.
_DTYPE_FIELD, _SHAPE_FIELD, _FLOAT_VAL_FIELD, _DOUBLE_VAL_FIELD = 1, 2, 5, 6
_DIM_FIELD, _DIM_SIZE_FIELD = 2, 1  # TensorShapeProto.dim, and TensorShapeProto.Dim.size
# From this many float/double values on, a request's typed field is read from the TensorProto's wire bytes (one
# serialization, then a copy) rather than value by value; below it, scanning the bytes costs more than it saves.
_WIRE_DECODE_MIN = 64
# DataTypes no request can send a model: DT_INVALID is none, DT_RESOURCE and DT_VARIANT are handles into a running
# process, and the reference types (101 and up, refused as unknown) exist only inside graphs. They are refused here,
# before TensorFlow is imported for the rare value types this module leaves to tf.make_ndarray.
_NO_VALUES = frozenset({tf_types.DT_INVALID, 20, 21})
_MAX_INT64 = (1 << 63) - 1
# The most bytes a request's tensor may expand to from fewer values than its shape holds (TensorFlow's rule: the
# last value repeats, none means zeros): the default gRPC message limit. A few bytes on the wire must not make the
# server allocate gigabytes; a tensor this large is sent in full (tensor_content), where the message limit rules.
MAX_EXPANDED_BYTES = 256 * 1024 * 1024
_VALUE_FIELDS = tuple(
    dict.fromkeys(["string_val", *(field for _, field in _FIELDS.values()), "resource_handle_val", "variant_val"])
)
_PACKED: dict[np.dtype[Any], tuple[bytes, int]] = {  # dtype → (its dtype field, encoded; its packed field)
    np.dtype(np.float32): (bytes([_DTYPE_FIELD << 3, _FIELDS[np.dtype(np.float32)][0]]), _FLOAT_VAL_FIELD),
    np.dtype(np.float64): (bytes([_DTYPE_FIELD << 3, _FIELDS[np.dtype(np.float64)][0]]), _DOUBLE_VAL_FIELD),
}


def to_numpy(proto: Any, alias: str, spec: TensorSpec | None = None) -> np.ndarray:
    """The array a request's TensorProto holds; a malformed one is INVALID_ARGUMENT naming the input.

    ``spec`` (the signature's input of that alias, when it has one) lets the error say what was expected.
    """
    try:
        entry = _DECODE.get(proto.dtype)
        if entry is None and proto.dtype != _DT_STRING:
            _check_value_type(proto.dtype)
            _check_shape(proto)
            if spec is not None and spec.dtype in tf_types.FIELDS:
                # Refused before tf.make_ndarray: the signature takes a type decoded here, so a rare one is not it,
                # and decoding it would import all of TensorFlow (seconds, a quarter GiB resident) only to say so.
                # A signature of a rare type itself (bfloat16, quantized: numpy's object here) takes the TF path.
                sent = tf_types.enum_name(proto.dtype)
                raise invalid_argument(f"Expects arg[{alias}] to be {spec.dtype_name} but {sent} is provided")
            import tensorflow as tf

            return tf.make_ndarray(proto)
        shape, count = _check_shape(proto)
        if entry is None:  # DT_STRING
            values: Any = list(proto.string_val)
            if not values:
                _check_no_stray_values(proto, "string_val")
            if len(values) < count:
                _check_expansion(count, np.dtype(object).itemsize)
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
        if not raw:
            _check_no_stray_values(proto, field)
        if len(raw) < count:
            _check_expansion(count, dtype.itemsize)
        if field == "half_val":
            values = np.array(raw, dtype=np.uint16).view(np.float16)
        elif len(raw) >= _WIRE_DECODE_MIN and dtype in _PACKED:
            values = np.frombuffer(_packed_values(proto, _PACKED[dtype][1]), dtype=dtype.newbyteorder("<"))
        else:  # fromiter: no sequence protocol per value, as np.array(raw) has
            values = np.fromiter(raw, dtype, len(raw))
        if values.size == count:
            return values.reshape(shape)
        if values.size == 0:
            return np.zeros(shape, dtype)
        if values.size < count:
            return np.pad(values, (0, count - values.size), "edge").reshape(shape)
        raise ValueError(f"{values.size} values do not fit the shape {list(shape)}")
    except ServingError as exc:  # a precise refusal of its own (a tensor too large to expand)
        if spec is None or exc.code is not Code.INVALID_ARGUMENT:
            raise ServingError(exc.code, f"Input tensor {alias}: {exc.message}") from None
        raise input_error(spec, f"{_proto_type(proto)} {_proto_shape(proto)}", exc.message) from None
    except Exception as exc:  # noqa: BLE001 - malformed content: wrong sizes, unknown dtype
        detail = f"Could not parse input tensor {alias}: {exc}"
        if spec is None:
            raise invalid_argument(detail) from None
        raise input_error(
            spec, f"a malformed TensorProto ({_proto_type(proto)} {_proto_shape(proto)})", detail
        ) from None


def _check_value_type(dtype: int) -> None:
    """Refuse a DataType no request can carry values of (see ``_NO_VALUES``), or one TensorFlow does not have."""
    if dtype in _NO_VALUES or dtype not in tf_types.NAMES:
        raise invalid_argument(f"{tf_types.enum_name(dtype)} is not a type of tensor workbench accepts in a request")


def _check_shape(proto: Any) -> tuple[list[int], int]:
    """The dimensions of a request's tensor and its element count; TensorFlow requires them known, non-negative
    and of an int64 count."""
    if proto.tensor_shape.unknown_rank:
        raise invalid_argument("a tensor's shape must have a known rank")
    shape = [d.size for d in proto.tensor_shape.dim]
    count = 1
    for d in shape:
        if d < 0:
            raise invalid_argument(f"dimension {d} of shape {shape_text(shape)} is negative")
        count *= d
    if count > _MAX_INT64:
        raise invalid_argument(f"shape {shape_text(shape)} has more elements than an int64 counts")
    return shape, count


def _check_expansion(count: int, itemsize: int) -> None:
    """Refuse a tensor whose few values would expand to more than ``MAX_EXPANDED_BYTES`` (RESOURCE_EXHAUSTED)."""
    if count * itemsize > MAX_EXPANDED_BYTES:
        raise ServingError(
            Code.RESOURCE_EXHAUSTED,
            f"its shape holds {count} elements ({count * itemsize} bytes), more than the "
            f"{MAX_EXPANDED_BYTES} bytes a tensor may expand to from fewer values; send it in full",
        )


def _check_no_stray_values(proto: Any, field: str) -> None:
    """A tensor whose own value field is empty must not carry values in another type's field.

    TensorFlow reads only the field of the tensor's dtype and would answer zeros for int64 values sent in
    float_val; workbench says what went wrong instead (a deliberate difference from TF Serving).
    """
    for other in _VALUE_FIELDS:
        if other != field and len(getattr(proto, other)):
            raise invalid_argument(
                f"a tensor of {tf_types.enum_name(proto.dtype)} carries its values in {other}; they go in {field}"
            )


def _proto_type(proto: Any) -> str:
    return tf_types.enum_name(proto.dtype)


def _proto_shape(proto: Any) -> str:
    if proto.tensor_shape.unknown_rank:
        return "of unknown rank"
    return shape_text([d.size for d in proto.tensor_shape.dim])


def from_numpy(array: np.ndarray, proto: Any) -> Any:
    """Fill ``proto`` (a TensorProto) with ``array``; returns it."""
    array = np.asarray(array)
    packed = _PACKED.get(array.dtype)
    if packed is not None:
        proto.MergeFromString(_packed_tensor(array, *packed))
        return proto
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


def _packed_tensor(array: np.ndarray, dtype_field: bytes, values_field: int) -> bytes:
    """A float/double TensorProto's wire bytes: its dtype, its shape, its values as one packed typed field."""
    values = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()  # C order, as reshape(-1) reads
    packed = _varint((values_field << 3) | 2) + _varint(len(values)) + values if values else b""
    return dtype_field + _shape_field(array.shape) + packed


def _packed_values(proto: Any, number: int) -> bytes:
    """The payload of packed field ``number`` in ``proto``'s wire bytes (b"" when it is absent).

    The bytes are the ones protobuf writes, so a repeated scalar is always packed, whatever the client sent.
    """
    wire = proto.SerializeToString()
    position, end = 0, len(wire)
    while position < end:
        tag, position = _read_varint(wire, position)
        wire_type = tag & 7
        if wire_type == 0:
            position = _read_varint(wire, position)[1]
        elif wire_type == 1:
            position += 8
        elif wire_type == 5:
            position += 4
        elif wire_type == 2:
            length, position = _read_varint(wire, position)
            if tag >> 3 == number:
                return wire[position : position + length]
            position += length
        else:
            raise ValueError(f"unexpected wire type {wire_type} in a TensorProto")
    return b""


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


@functools.lru_cache(maxsize=1024)  # answers repeat a few shapes: encode each once
def _shape_field(shape: tuple[int, ...]) -> bytes:
    dims = b"".join(_message(_DIM_FIELD, _varint(_DIM_SIZE_FIELD << 3) + _varint(size)) for size in shape)
    return _message(_SHAPE_FIELD, dims) if dims else b""


def _message(number: int, payload: bytes) -> bytes:
    """An embedded message field (wire type 2)."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    """A non-negative integer as a protobuf varint (dimension sizes and lengths are never negative)."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [bytes([value]) for value in range(0x80)]
