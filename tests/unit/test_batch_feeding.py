"""How a data file's columns feed a signature (workbench.batch_prediction.feeding), and the rows that cannot."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.batch_prediction.feeding import feeding_for
from workbench.batch_prediction.formats import RECORD_COLUMN
from workbench.core.errors import ServingError
from workbench.core.signatures import Signature, TensorSpec

F64 = np.dtype(np.float64)


def signature(inputs: dict[str, tuple[np.dtype, tuple[int, ...]]], features: tuple[str, ...] = ()) -> Signature:
    specs = {alias: TensorSpec(alias, alias, dtype, shape) for alias, (dtype, shape) in inputs.items()}
    return Signature("serving_default", "tensorflow/serving/predict", specs, {}, features=features)


def test_pixel_columns_stack_into_a_one_input_matrix_in_file_order_beside_the_id():
    columns = {"id": np.array(["a", "b"], dtype=object), "p0": np.array([1, 2]), "p1": np.array([3.5, 4.5])}
    feeding = feeding_for(signature({"x": (F64, (-1, 2))}), columns, {}, "id")
    feed, errors = feeding.feed(columns)
    assert errors == {}
    np.testing.assert_array_equal(feed["x"], [[1.0, 3.5], [2.0, 4.5]])
    assert feed["x"].dtype == F64


def test_columns_named_after_inputs_feed_them_and_a_rename_maps_others():
    columns = {"pixels": np.ones((3, 4)), "scale": np.array([1, 2, 3])}
    sig = signature({"x": (F64, (-1, 4)), "s": (np.dtype(np.int64), (-1,))})
    feed, _ = feeding_for(sig, columns, {"pixels": "x", "scale": "s"}, None).feed(columns)
    assert feed["x"].shape == (3, 4) and feed["s"].tolist() == [1, 2, 3]


def test_a_model_that_knows_its_features_takes_them_by_name_whatever_their_order():
    columns = {"bmi": np.array([1.0]), "age": np.array([2.0])}
    feeding = feeding_for(signature({"x": (F64, (-1, 2))}, features=("age", "bmi")), columns, {}, None)
    assert feeding.sources == {"age": ("age",), "bmi": ("bmi",)}


def test_a_string_input_takes_the_serialized_examples_of_a_tfrecord():
    columns = {"x": np.ones(2), RECORD_COLUMN: np.array([b"\x0a\x00", b"\x0a\x00"], dtype=object)}
    feeding = feeding_for(signature({"examples": (np.dtype(object), (-1,))}), columns, {}, None)
    feed, _ = feeding.feed(columns)
    assert feed["examples"].tolist() == [b"\x0a\x00", b"\x0a\x00"]


def test_values_that_do_not_cast_fail_their_rows_alone():
    columns = {
        "a": np.array(["1.5", "seven", None, "4"], dtype=object),
        "b": np.array([1.0, 2.0, 3.0, np.nan]),  # NaN is a float: the model says whether it takes it
    }
    feed, errors = feeding_for(signature({"x": (F64, (-1, 2))}), columns, {}, None).feed(columns)
    assert errors == {1: "column a: 'seven' is not a float64", 2: "column a: a missing value is not a float64"}
    np.testing.assert_array_equal(feed["x"], [[1.5, 1.0], [4.0, np.nan]])


def test_a_fraction_or_a_missing_value_does_not_become_an_integer():
    columns = {"n": np.array([1.0, 2.5, np.nan, 4.0])}
    feed, errors = feeding_for(signature({"n": (np.dtype(np.int64), (-1,))}), columns, {}, None).feed(columns)
    assert sorted(errors) == [1, 2] and feed["n"].tolist() == [1, 4]


@pytest.mark.parametrize(
    ("columns", "renames", "message"),
    [
        ({"a": np.ones(2), "b": np.ones(2)}, {}, r"make rows of 2 values; x takes 3"),
        ({"a": np.ones(2)}, {"z": "x"}, "--columns names z, which the input does not have"),
        ({"id": np.ones(2)}, {}, "do not name the model's inputs"),
    ],
)
def test_columns_that_cannot_feed_the_model_are_refused_before_a_row_runs(columns, renames, message):
    with pytest.raises(ServingError, match=message):
        feeding_for(signature({"x": (F64, (-1, 3))}), columns, renames, "id" if "id" in columns else None)
