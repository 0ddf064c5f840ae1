"""Triton's tensor data types (``TYPE_FP32``…) as numpy dtypes, shared by the config readers of a Triton model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

DATA_TYPES: Mapping[str, np.dtype[Any]] = {
    "TYPE_BOOL": np.dtype(bool),
    "TYPE_UINT8": np.dtype(np.uint8),
    "TYPE_UINT16": np.dtype(np.uint16),
    "TYPE_UINT32": np.dtype(np.uint32),
    "TYPE_UINT64": np.dtype(np.uint64),
    "TYPE_INT8": np.dtype(np.int8),
    "TYPE_INT16": np.dtype(np.int16),
    "TYPE_INT32": np.dtype(np.int32),
    "TYPE_INT64": np.dtype(np.int64),
    "TYPE_FP16": np.dtype(np.float16),
    "TYPE_FP32": np.dtype(np.float32),
    "TYPE_FP64": np.dtype(np.float64),
    "TYPE_STRING": np.dtype(object),  # numpy object arrays of bytes, as everywhere in workbench
}


def data_type_name(value: int) -> str:
    """Triton's name of a ``DataType`` enum value: ``TYPE_FP32``."""
    from tritonclient.grpc import model_config_pb2

    return str(model_config_pb2.DataType.Name(value))
