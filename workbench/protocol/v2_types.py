"""The Open Inference Protocol's (KServe v2, Triton) datatypes ↔ numpy, for its REST and gRPC edges.

v2 names a tensor's type with a string ("FP32", "BYTES"); every type that has a numpy equivalent maps to it, BYTES
to numpy ``object`` holding ``bytes`` as workbench's signatures keep strings. BF16 has no numpy type of its own:
it maps to ``ml_dtypes.bfloat16`` where that package is installed (tritonclient brings it), else it is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.protocol.bytes_codec import pack_bytes

BYTES = "BYTES"
BF16 = "BF16"

# The typed InferTensorContents field of each datatype in gRPC messages (FP16 and BF16 have none: they travel raw).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}

_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    BYTES: np.dtype(object),
}
_FROM_NUMPY: dict[np.dtype[Any], str] = {dtype: name for name, dtype in _TO_NUMPY.items()}
DATATYPES = (*_TO_NUMPY, BF16)


def impossible_shape(shape: Sequence[int], itemsize: int) -> bool:
    """True for a shape no array can have, even one of no elements: its non-zero dimensions take more bytes than an
    int64 counts (numpy's own limit, which it raises as a ValueError only when the array is made)."""
    return math.prod(d for d in shape if d) * max(itemsize, 1) > (1 << 63) - 1


def _bfloat16() -> np.dtype[Any] | None:
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def to_numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy type of a v2 datatype; an unknown one is INVALID_ARGUMENT listing the known ones."""
    dtype = _TO_NUMPY.get(datatype)
    if dtype is None and datatype == BF16:
        dtype = _bfloat16()
        if dtype is None:
            raise ServingError(Code.UNIMPLEMENTED, "BF16 tensors need the ml_dtypes package (pip install ml-dtypes)")
    if dtype is None:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"Unknown datatype {datatype!r}; v2 datatypes are {', '.join(DATATYPES)}"
        )
    return dtype


def to_datatype(dtype: np.dtype[Any]) -> str:
    """The v2 datatype of a numpy type: strings (object, bytes, str) are BYTES."""
    if dtype.kind in "OSU":
        return BYTES
    name = _FROM_NUMPY.get(dtype)
    if name is None and dtype == _bfloat16():
        return BF16
    if name is None:
        raise ServingError(Code.UNIMPLEMENTED, f"The v2 protocol has no datatype for numpy {dtype}")
    return name


def element_size(datatype: str) -> int:
    """Bytes per element in raw (binary) form; BYTES elements are length-prefixed and have no fixed size."""
    if datatype == BYTES:
        raise ValueError("BYTES elements have no fixed size")
    return to_numpy_dtype(datatype).itemsize


def raw_contents(value: np.ndarray, datatype: str) -> bytes:
    """A tensor's raw form, for every v2 edge: BYTES elements length-prefixed (:mod:`~workbench.protocol.bytes_codec`),
    anything else its elements row-major in little-endian order (one copy)."""
    if datatype == BYTES:
        return pack_bytes(value)
    return value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes()
