"""The REST JSON fast paths against the general ones they stand in for, byte for byte.

Responses: orjson (:mod:`workbench.protocol.json_numbers`) where it writes what ``json.dumps`` writes, else the
general writer; every case here is encoded by :func:`json_tensor.encode_predict_response` and by a copy of the
general writer alone (:func:`general_response`), and the bytes must be equal, whichever path the first one took.
Requests: numpy's conversion of regular numbers (:func:`json_tensor._numeric_fast_path`), small and large, against
the element-by-element walk, and the values it must hand to the walk (ragged lists, lossy numbers, booleans).
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.core.errors import ServingError
from workbench.core.signatures import TensorSpec
from workbench.protocol import json_numbers, json_tensor
from workbench.protocol.json_tensor import BYTES_SUFFIX, Format, dumps, to_json_value


def general_response(outputs: dict[str, np.ndarray], fmt: Format) -> bytes:
    """The general writer alone: every value through to_json_value and json.dumps (the encoder before orjson)."""
    names = sorted(outputs)
    values = {n: to_json_value(outputs[n], n.endswith(BYTES_SUFFIX)) for n in names}
    if fmt is Format.COLUMNAR:
        return dumps({"outputs": values[names[0]] if len(names) == 1 else values})
    batch = outputs[names[0]].shape[0]
    if len(names) == 1:
        return dumps({"predictions": values[names[0]]})
    return dumps({"predictions": [{n: values[n][i] for n in names} for i in range(batch)]})


def around(value: float) -> list[float]:
    """``value`` and its float64 and float32 neighbours: where a range check would be off by one."""
    f32 = np.float32(value)
    return [
        value,
        float(np.nextafter(value, 0.0)),
        float(np.nextafter(value, np.inf)),
        float(f32),
        float(np.nextafter(f32, np.float32(0))),
        float(np.nextafter(f32, np.float32(np.inf))),
    ]


EDGES = [0.0, -0.0, 1.0, 0.1, 2.5, 3.0, 123456.789, *around(1e-4), *around(1e-5), *around(1e12), *around(1e13)]
EDGES += [*around(1e15), *around(1e16), *[-v for v in around(1e-4)], 1e-7, 5e-324, 1.5e300]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("value", EDGES)
def test_float_edges_write_the_same_bytes(dtype, value):
    with np.errstate(over="ignore"):
        array = np.array([[value]], dtype)
    for fmt in Format:
        assert json_tensor.encode_predict_response({"y": array}, fmt) == general_response({"y": array}, fmt)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [3, 40])  # under and over the size checked value by value in Python
def test_random_floats_across_magnitudes_write_the_same_bytes(dtype, size):
    rng = np.random.default_rng(size)
    for _ in range(200):
        array = (rng.standard_normal(size) * 10.0 ** rng.uniform(-6, 17, size)).astype(dtype).reshape(size, 1)
        if rng.random() < 0.3:
            array[rng.integers(size)] = 0.0
        for fmt in Format:
            assert json_tensor.encode_predict_response({"y": array}, fmt) == general_response({"y": array}, fmt)


def test_floats_in_range_take_the_fast_path_and_others_do_not():
    assert json_numbers.fits(np.array([[3.0], [0.0], [0.5]], np.float32))
    assert json_numbers.fits(np.linspace(-1e11, 1e11, 100))  # the numpy branch
    assert json_numbers.fits(np.zeros((50,), np.float32))
    for unfit in (
        np.array([np.nan, 1.0]),
        np.array([np.inf] * 20),
        np.array([1e-5, 1.0], np.float32),
        np.array([0.0] * 20 + [1e-7]),
        np.array([1e13] * 20),
        np.array([1.0], np.float16),
        np.array([b"a"], object),
        np.array(2.0),  # a scalar: the columnar answer is a bare number
        np.arange(20.0).reshape(4, 5)[:, 1],  # not contiguous
    ):
        assert not json_numbers.fits(unfit), unfit


@pytest.mark.parametrize(
    "array",
    [
        np.array([[1, -2], [3, 4]], np.int32),
        np.array([2**63 - 1, -(2**63)], np.int64),
        np.array([2**64 - 1, 0], np.uint64),
        np.array([0, 255], np.uint8),
        np.array([[True, False]]),
        np.zeros((0,), np.float32),
        np.zeros((2, 0), np.int64),
    ],
)
def test_integers_booleans_and_empty_write_the_same_bytes(array):
    assert json_numbers.fits(array)
    for fmt in Format:
        assert json_tensor.encode_predict_response({"y": array}, fmt) == general_response({"y": array}, fmt)


@pytest.mark.parametrize(
    "names, plain",
    [
        (("a", "b"), True),
        (("probabilities", "classes"), True),
        (('quo"te', "b"), False),
        (("back\\slash", "b"), False),
        (("tab\t", "b"), False),
        (("é", "b"), False),
    ],
)
def test_several_outputs_write_the_same_bytes(names, plain):
    outputs = {
        names[0]: np.array([[0.25, 1.5], [3.0, -4.0]], np.float32),
        names[1]: np.array([7, 8], np.int64),
    }
    for fmt in Format:
        assert json_tensor.encode_predict_response(outputs, fmt) == general_response(outputs, fmt)
    assert json_numbers.plain_keys(names) == plain  # keys that need escaping take the general writer


def test_outputs_the_fast_path_cannot_write_fall_back_to_the_general_writer():
    outputs = {
        "scores": np.array([[0.5], [np.nan]], np.float32),
        "label_bytes": np.array([b"\xff", b"cat"], object),
        "words": np.array(["dog", "ça"], object),
    }
    for fmt in Format:
        assert json_tensor.encode_predict_response(outputs, fmt) == general_response(outputs, fmt)


def test_row_format_errors_are_unchanged_on_the_fast_path():
    with pytest.raises(ServingError, match="inconsistent batch size: 3 expecting: 2"):
        json_tensor.encode_predict_response({"a": np.zeros((2, 1)), "b": np.zeros((3, 1))}, Format.ROW)
    with pytest.raises(ServingError, match="Tensor name: a has no shape information"):
        json_tensor.encode_predict_response({"a": np.array(1.0), "b": np.zeros((3, 1))}, Format.ROW)


# ------------------------------------------------------------------------------------------------------ requests
FLOAT = TensorSpec(alias="x", name="x:0", dtype=np.dtype(np.float32), shape=None)
DOUBLE = TensorSpec(alias="x", name="x:0", dtype=np.dtype(np.float64), shape=None)
INT32 = TensorSpec(alias="x", name="x:0", dtype=np.dtype(np.int32), shape=None)


@pytest.mark.parametrize("spec", [FLOAT, DOUBLE, INT32])
@pytest.mark.parametrize("rows", [1, 4, 40])  # the few values checked in Python, the many by numpy
def test_regular_numbers_convert_as_the_walk_does(spec, rows):
    rng = np.random.default_rng(rows)
    if spec is INT32:
        value = rng.integers(-1000, 1000, (rows, 3)).tolist()
    else:
        value = (rng.standard_normal((rows, 3)) * 1000).tolist()
        value[0][0] = 7  # an int token among floats
    fast = json_tensor._numeric_fast_path(value, spec.dtype)
    assert fast is not None
    walked = json_tensor._walk(value, spec)
    assert fast.dtype == walked.dtype == spec.dtype
    assert fast.shape == walked.shape
    assert np.array_equal(fast, walked)


@pytest.mark.parametrize("rows", [1, 40])
def test_values_the_fast_path_hands_to_the_walk(rows):
    limit = (1 << 24) - 1
    for value in (
        [[1.0, 2.0], [3.0]] * rows,  # ragged
        [[float(limit + 1)]] * rows,  # float32 cannot hold it exactly: the walk decides
        [[limit + 1]] * rows,
        [[-(2**63)]] * rows,  # |int64 min| overflows numpy's abs: still refused
        [["1.0"]] * rows,  # strings
    ):
        assert json_tensor._numeric_fast_path(value, FLOAT.dtype) is None, value
    nan_and_small = [[float("nan")], [1.0]] * rows
    out = json_tensor._numeric_fast_path(nan_and_small, FLOAT.dtype)  # a NaN alone does not send it to the walk
    assert out is not None and np.isnan(out[0, 0]) and out[1, 0] == 1.0


def test_a_boolean_among_numbers_is_refused_on_either_path():
    for body in (b'{"instances": [1.0, true]}', b'{"instances": [' + b"1.0, " * 40 + b"true]}"):
        with pytest.raises(ServingError, match="Type: True is not of expected type: float"):
            json_tensor.decode_predict_request(body, lambda name, sent: {"x": FLOAT})
