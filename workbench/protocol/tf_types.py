"""TensorFlow's DataType enum ↔ numpy, for TF Serving's messages (TensorProto, SignatureDef, JSON metadata).

The numbers are TensorFlow's ``types.proto``; keeping the table here, rather than asking TensorFlow, lets the
protocol edge and the client translate types without importing TensorFlow (seconds, in a fresh kernel).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError

DT_INVALID = 0
DT_STRING = 7

# numpy dtype → (DataType enum, TensorProto field holding the values)
FIELDS: dict[np.dtype[Any], tuple[int, str]] = {
    np.dtype(np.float32): (1, "float_val"),
    np.dtype(np.float64): (2, "double_val"),
    np.dtype(np.int32): (3, "int_val"),
    np.dtype(np.uint8): (4, "int_val"),
    np.dtype(np.int16): (5, "int_val"),
    np.dtype(np.int8): (6, "int_val"),
    np.dtype(np.complex64): (8, "scomplex_val"),
    np.dtype(np.int64): (9, "int64_val"),
    np.dtype(np.bool_): (10, "bool_val"),
    np.dtype(np.uint16): (17, "int_val"),
    np.dtype(np.complex128): (18, "dcomplex_val"),
    np.dtype(np.float16): (19, "half_val"),
    np.dtype(np.uint32): (22, "uint32_val"),
    np.dtype(np.uint64): (23, "uint64_val"),
}
_BY_ENUM: dict[int, np.dtype[Any]] = {enum: dtype for dtype, (enum, _) in FIELDS.items()}

# Enum names as TF Serving's JSON metadata prints them ("DT_FLOAT"); types numpy has no equivalent for (bfloat16,
# quantized, resource, variant) are listed so a SignatureDef that mentions them can still be described.
NAMES: dict[int, str] = {
    0: "DT_INVALID",
    1: "DT_FLOAT",
    2: "DT_DOUBLE",
    3: "DT_INT32",
    4: "DT_UINT8",
    5: "DT_INT16",
    6: "DT_INT8",
    7: "DT_STRING",
    8: "DT_COMPLEX64",
    9: "DT_INT64",
    10: "DT_BOOL",
    11: "DT_QINT8",
    12: "DT_QUINT8",
    13: "DT_QINT32",
    14: "DT_BFLOAT16",
    15: "DT_QINT16",
    16: "DT_QUINT16",
    17: "DT_UINT16",
    18: "DT_COMPLEX128",
    19: "DT_HALF",
    20: "DT_RESOURCE",
    21: "DT_VARIANT",
    22: "DT_UINT32",
    23: "DT_UINT64",
}
_BY_NAME = {name: enum for enum, name in NAMES.items()}


def to_enum(dtype: np.dtype[Any]) -> int:
    """The DataType of a numpy type; strings (object, bytes, str) are DT_STRING."""
    if dtype.kind in "OSU":
        return DT_STRING
    entry = FIELDS.get(dtype)
    if entry is None:
        raise ServingError(Code.UNIMPLEMENTED, f"TF Serving's protocol has no type for numpy {dtype}")
    return entry[0]


def to_numpy_dtype(enum: int) -> np.dtype[Any]:
    """The numpy type that holds a DataType's values; strings and types numpy lacks are ``object``."""
    return _BY_ENUM.get(enum, np.dtype(object))


def enum_from_name(name: str | int) -> int:
    """``"DT_FLOAT"`` (proto3 JSON) or ``1`` → 1."""
    if isinstance(name, int):
        return name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ServingError(Code.INVALID_ARGUMENT, f"Unknown TensorFlow data type: {name}") from None


def enum_name(enum: int) -> str:
    return NAMES.get(enum, f"dtype {enum}")
