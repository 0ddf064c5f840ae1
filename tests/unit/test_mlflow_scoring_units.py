"""MLflow scoring's codec: a ``dataframe_split`` read onto a column signature gives each column the values and the
type it had on its own, whether the frame is read as one matrix (one number type, distinct names) or column by
column."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.core.signatures import Signature, TensorSpec
from workbench.protocol import mlflow_scoring

pytest.importorskip("pandas")


def signature(**dtypes: str) -> Signature:
    inputs = {name: TensorSpec(name, name, np.dtype(dtype), (-1,)) for name, dtype in dtypes.items()}
    return Signature("serving_default", "predict", inputs, {})


def inputs_of(body: dict, sig: Signature) -> dict[str, np.ndarray]:
    return mlflow_scoring.request_inputs(
        mlflow_scoring.read_request(json.dumps(body).encode(), "application/json"), sig
    )


@pytest.mark.parametrize(
    ("data", "dtypes", "expected"),
    [
        ([[1.5, 2.0], [3.0, 4.25]], {"a": "float64", "b": "float64"}, {"a": [1.5, 3.0], "b": [2.0, 4.25]}),
        ([[1, 2], [3, 4]], {"a": "float32", "b": "int64"}, {"a": [1.0, 3.0], "b": [2, 4]}),
        # One number type: a long column keeps every digit (no round trip through float64).
        ([[2**60 + 1, 1], [3, 4]], {"a": "int64", "b": "int64"}, {"a": [2**60 + 1, 3], "b": [1, 4]}),
        # Mixed types: column by column, an int column stays exact.
        ([[2**60 + 1, 1.5], [3, 4.0]], {"a": "int64", "b": "float64"}, {"a": [2**60 + 1, 3], "b": [1.5, 4.0]}),
        ([["x", 1.0], ["y", 2.0]], {"a": "object", "b": "float64"}, {"a": [b"x", b"y"], "b": [1.0, 2.0]}),
    ],
)
def test_split_frame_columns(data: list, dtypes: dict[str, str], expected: dict[str, list]) -> None:
    got = inputs_of({"dataframe_split": {"columns": list(dtypes), "data": data}}, signature(**dtypes))
    for name, values in expected.items():
        assert got[name].dtype == np.dtype(dtypes[name])
        assert got[name].tolist() == values
        assert got[name].flags.c_contiguous


def test_fractions_refused_for_a_long_column() -> None:
    with pytest.raises(Exception, match="not whole numbers"):
        inputs_of({"dataframe_split": {"columns": ["a", "b"], "data": [[1.5, 2.0]]}}, signature(a="int64", b="float64"))
